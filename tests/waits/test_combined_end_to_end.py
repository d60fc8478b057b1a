"""The combined wait through the real thing (uvicorn, a Celery worker, Celery beat, PostgreSQL,
Redis, the simulated service): each of the four ways to end it once, and a callback racing a
person's result over HTTP. Each ends the wait exactly once, with one resume, and the wait's
ledger names the channel."""

from __future__ import annotations

import threading

import httpx
import pytest

from accounts.services import api_token_create
from jobs.models import Job
from tests.conftest import make_user
from tests.support.processes import wait_until
from tests.waitkinds.kinds import seen
from tests.waits.conftest import PUBLIC_URL
from tests.waits.helpers import finished, parked, submit, the_wait
from waits.models import WaitDecision

pytestmark = pytest.mark.worker


def resumes(job: Job) -> int:
    """Moves into `pending` after the submit."""
    return job.events.filter(type="status", status="pending").count() - 1


def ended(job: Job) -> list[tuple[str, str]]:
    return list(WaitDecision.objects.filter(job=job).exclude(kind="refused").values_list("kind", "channel"))


def api_key(username: str) -> str:
    _, key = api_token_create(user=make_user(username, reviewer=True), name="test")
    return key


def provide(wait_id: int, key: str, text: str) -> httpx.Response:
    return httpx.post(f"{PUBLIC_URL}/api/waits/{wait_id}/provide/", json={"result": {"text": text}},
                      headers={"Authorization": f"Token {key}"}, timeout=10)


def test_the_callback_ends_a_combined_wait(stack):
    job = finished(submit("demo.generate", prompt="a haiku", delay=0.3, stand_in=True))
    assert job.status == "completed" and job.result == {"text": "A generated answer to: a haiku"}, job.error
    assert the_wait(job).ended_by == "callback" and ended(job) == [("succeeded", "callback")]
    assert resumes(job) == 1


def test_a_backup_check_ends_a_combined_wait(stack):
    job = finished(submit("test.wait", delay=0.2, drop_callback=True, marks=[1, 60], person=True))
    assert job.status == "completed" and job.result["ended_by"] == "check", job.error
    assert ended(job) == [("succeeded", "check")] and resumes(job) == 1


def test_a_person_ends_a_combined_wait_through_the_api(stack):
    key = api_key("rita")
    job = submit("demo.generate", prompt="a limerick", delay=3600, drop_callback=True, stand_in=True)
    wait = parked(job)
    response = provide(wait.pk, key, "written by rita")
    assert response.status_code == 200 and response.json()["ended_by"] == "person", response.json()
    job = finished(job)
    assert job.status == "completed" and job.result == {"text": "written by rita"}, job.error
    assert ended(job) == [("provided", "person")] and resumes(job) == 1
    assert WaitDecision.objects.get(job=job).via == "api"


def test_the_deadline_ends_a_combined_wait(stack):
    job = submit("test.wait", delay=3600, drop_callback=True, marks=[60], person=True, timeout=1,
                 on_timeout={"action": "default", "answer": {"text": "fallback"}})
    job = finished(job)  # beat applies the policy within a pass of the deadline
    assert job.status == "completed" and job.result == {"text": "fallback", "ended_by": "deadline"}, job.error
    assert ended(job) == [("defaulted", "deadline")] and resumes(job) == 1


def test_a_callback_and_a_person_arriving_together_resume_the_job_once(stack):
    key = api_key("rita")
    job = submit("test.wait", delay=3600, marks=[60], person=True)
    wait = parked(job)
    token = seen(job.pk, "tokens")[0]
    barrier = threading.Barrier(2)
    answers: dict[str, httpx.Response] = {}

    def send(name: str, request) -> None:
        barrier.wait(timeout=10)
        answers[name] = request()

    threads = [
        threading.Thread(target=send, args=("callback", lambda: httpx.post(f"{PUBLIC_URL}/api/wake/{token}/",
                                                                           timeout=10))),
        threading.Thread(target=send, args=("person", lambda: provide(wait.pk, key, "rita's"))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    callback, person = answers["callback"], answers["person"]
    # The job settles: completed with the person's result, or parked again after the callback's
    # check found the generation still running.
    wait_until(lambda: Job.objects.get(pk=job.pk).status in ("completed", "waiting")
               and Job.objects.get(pk=job.pk).events.filter(type="status", status="processing").count() == 2,
               timeout=30, interval=0.05, message="the job did not settle after the race")
    job = Job.objects.get(pk=job.pk)
    assert resumes(job) == 1
    if person.status_code == 200:  # the person came first: the callback is told
        assert callback.status_code == 404 and "rita provided the result" in callback.json()["detail"]
        assert job.status == "completed" and job.result["text"] == "rita's"
    else:  # the callback came first: the person is told, and may act once the job parks again
        assert callback.status_code == 202, callback.text
        assert person.status_code == 409 and person.json()["code"] in ("wait_busy", "wait_ended"), person.json()
        assert "called back" in person.json()["detail"] or "running" in person.json()["detail"]
        assert job.status == "waiting"
        assert provide(wait.pk, key, "rita's").status_code == 200
        assert finished(job).result["text"] == "rita's"
