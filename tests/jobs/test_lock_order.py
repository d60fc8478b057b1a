"""One lock order everywhere: the job's row first (issue 13, item 8). A cancel (job, then its
questions and waits) racing an answer, a callback, a "check now" or a deadline (which used to lock
the question or the wait, then the job) never deadlocks: both finish, one after the other, and
neither caller sees a 500. A transaction that still loses a deadlock is retried."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from approvals.models import Question
from approvals.services import answering, deadlines, question_answer, question_expire
from jobs.errors import InvalidTransition, PlatformError
from jobs.models import Job
from jobs.services import job_cancel, job_submit
from tests.approvals.conftest import paused_on
from tests.conftest import make_user
from tests.support.runs import fresh, run
from waits import services as wait_services
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import wait_check_now, wake_token, wake_token_redeem

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("only_own_workers"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and deadlocks of PostgreSQL"),
]


def blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def race(first, second, *, hold: Any, monkeypatch) -> list[Any]:
    """Run `first` in a thread until it reaches `hold` (a module attribute it calls while holding
    its first lock), start `second`, wait until `second` waits on a lock, then let `first` go on.
    Returns what each returned or raised."""
    module, name = hold
    reached, release = threading.Event(), threading.Event()
    real = getattr(module, name)

    def held(*args, **kwargs):
        reached.set()
        release.wait(timeout=10)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, held)
    results: list[Any] = [None, None]

    def call(index, fn):
        try:
            results[index] = fn()
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            results[index] = exc
        finally:
            connections.close_all()

    one = threading.Thread(target=call, args=(0, first))
    one.start()
    assert reached.wait(timeout=10), "the first call never reached its lock"
    two = threading.Thread(target=call, args=(1, second))
    two.start()
    deadline = time.monotonic() + 5
    while not blocked_on_a_lock() and time.monotonic() < deadline:
        time.sleep(0.02)
    release.set()
    one.join(timeout=30)
    two.join(timeout=30)
    return results


def no_server_error(results: list[Any]) -> None:
    for result in results:
        assert not isinstance(result, BaseException) or isinstance(result, PlatformError), repr(result)


def test_an_answer_and_a_cancel_at_once(monkeypatch):
    ann = make_user("ann", reviewer=True)
    job, question = paused_on({})
    results = race(
        lambda: question_answer(question_id=question.pk, user=ann, answer={"approved": True}),
        lambda: job_cancel(job_id=job.pk),
        hold=(answering, "answer_validate"), monkeypatch=monkeypatch,
    )
    no_server_error(results)
    # The answer came first (it held the job); the cancel then cancelled the resumed job.
    assert isinstance(results[0], Question) and fresh(job).status == Job.Status.CANCELLED
    assert Question.objects.get(pk=question.pk).status == Question.Status.ANSWERED


def test_a_deadline_and_a_cancel_at_once(monkeypatch):
    job, question = paused_on({"timeout": 60})
    later = timezone.now() + timedelta(minutes=5)
    results = race(
        lambda: question_expire(question_id=question.pk, now=later),
        lambda: job_cancel(job_id=job.pk),
        hold=(deadlines, "decision_record"), monkeypatch=monkeypatch,
    )
    no_server_error(results)
    assert results[0] == "fail" and isinstance(results[1], InvalidTransition)  # it had failed meanwhile
    assert fresh(job).status == Job.Status.FAILED


@pytest.fixture
def parked_job():
    job, _ = job_submit(kind="demo.noop", input={})
    body = lambda ctx: ctx.wait_for("a", submit=lambda token, url: "ext", check=lambda _: CheckResult.pending())  # noqa: E731
    assert run(job.pk, body) == "waiting"
    return job, Wait.objects.get(job=job)


@pytest.mark.parametrize("wake", ["callback", "check_now"])
def test_a_wake_and_a_cancel_at_once(wake, parked_job, monkeypatch):
    job, wait = parked_job
    call = (lambda: wake_token_redeem(token=wake_token(wait.token_salt))) if wake == "callback" else (
        lambda: wait_check_now(wait_id=wait.pk))
    results = race(call, lambda: job_cancel(job_id=job.pk), hold=(wait_services, "_wake"), monkeypatch=monkeypatch)
    no_server_error(results)
    assert fresh(job).status == Job.Status.CANCELLED
    assert Wait.objects.get(pk=wait.pk).state == Wait.State.CANCELLED


def test_a_transaction_that_loses_a_deadlock_is_retried(monkeypatch):
    """Whatever still deadlocks (another lock than ours) is retried, not shown as a 500."""
    ann = make_user("ann", reviewer=True)
    job, question = paused_on({})
    real = answering.answer_validate
    calls = []

    def deadlocked_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            with connection.cursor() as cursor:  # what PostgreSQL raises for the loser of a deadlock
                cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$")
        return real(**kwargs)

    monkeypatch.setattr(answering, "answer_validate", deadlocked_once)
    answered = question_answer(question_id=question.pk, user=ann, answer={"approved": True})
    assert answered.status == Question.Status.ANSWERED and len(calls) == 2


def test_a_deadlock_lost_again_and_again_is_a_retryable_503(monkeypatch):
    from rest_framework.test import APIClient

    ann = make_user("ann", reviewer=True)
    job, question = paused_on({})

    def deadlocked(**kwargs):
        with connection.cursor() as cursor:
            cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$")

    monkeypatch.setattr(answering, "answer_validate", deadlocked)
    client = APIClient()
    client.force_authenticate(ann)
    response = client.post(f"/api/questions/{question.pk}/answer/", {"answer": {"approved": True}}, format="json")
    assert response.status_code == 503 and response.json()["code"] == "busy"
    assert int(response["Retry-After"]) >= 1
    assert Question.objects.get(pk=question.pk).status == Question.Status.OPEN
