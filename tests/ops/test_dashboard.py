"""The staff dashboard (`/ops/`, `/ops/data/`): who may see it, and that its numbers are the rows'.

Jobs are made the way the platform makes them (`job_submit`, a run through `job_execute` in this
process, answers through `question_answer`, a callback through `wake_token_redeem`); where a
number depends on time (durations, ages, the minute a change falls in) the test sets the
timestamps and, for the per-minute series, pins the selectors' clock.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.models import Question
from approvals.services import question_answer
from jobs.models import Job, JobEvent
from jobs.registry import JobKind, _kinds
from jobs.runner import job_execute
from jobs.services import job_submit
from ops.dashboard import STATUS_COLORS
from ops.selectors import jobs_per_minute, question_backlog
from tests.conftest import make_user
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import wake_token, wake_token_redeem

pytestmark = pytest.mark.django_db

PAGE, DATA = "/ops/", "/ops/data/"


def run(kind: str, input: dict | None = None, **kwargs) -> Job:
    """Submit a job and run it once here, as a worker would."""
    job, _ = job_submit(kind=kind, input=input or {}, **kwargs)
    job_execute(job_id=job.pk)
    return Job.objects.get(pk=job.pk)


def data(client) -> dict:
    response = client.get(DATA)
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    return response.json()


def tile(payload: dict, key: str) -> dict:
    return next(t for t in payload["tiles"] if t["key"] == key)


@pytest.fixture
def staff(client):
    user = make_user("operator", staff=True)
    client.force_login(user)
    return user


@pytest.fixture
def park_kind(monkeypatch):
    """`ops.park`: hands work to a "renderer" and parks until woken; the check then finds it done."""

    def park(ctx, input):
        return ctx.wait_for("render", submit=lambda token, callback_url: "render-1",
                            check=lambda external_id: CheckResult.succeeded({"pages": 3}), service="renderer")

    monkeypatch.setitem(_kinds, "ops.park", JobKind(name="ops.park", handler=park))


# -- who may see it -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [PAGE, DATA])
def test_anonymous_callers_are_sent_to_the_admin_login(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('admin:login')}?next={path}"


@pytest.mark.parametrize("path", [PAGE, DATA])
def test_signed_in_users_who_are_not_staff_get_403(client, path):
    client.force_login(make_user("viewer"))
    assert client.get(path).status_code == 403


def test_staff_see_the_page_in_the_admin_look_with_local_scripts_only(client, staff):
    response = client.get(PAGE)
    assert response.status_code == 200
    page = response.content.decode()
    assert "<h1>Operations dashboard</h1>" in page and 'id="site-name"' in page  # the admin's header
    for canvas in ("chart-jobs", "chart-durations", "chart-backlog", "chart-question-ages", "chart-waits",
                   "chart-wait-ages"):
        assert f'<canvas id="{canvas}"' in page
    scripts = re.findall(r'<script[^>]* src="([^"]+)"', page)
    assert "/static/ops/vendor/chart.js/chart.umd.min.js" in scripts
    assert all(src.startswith("/static/") for src in scripts), scripts  # no CDN
    vendored = client.get("/static/ops/vendor/chart.js/chart.umd.min.js")
    assert vendored.status_code == 200
    assert b"Chart.js v4.6.1" in b"".join(vendored.streaming_content)
    assert 'id="ops-data"' in page  # the snapshot the charts start from


def test_the_admin_index_links_to_the_dashboard_and_keeps_the_inbox_count(client, staff):
    page = client.get(reverse("admin:index")).content.decode()
    assert f'href="{PAGE}"' in page
    reviewer = make_user("rita", reviewer=True)
    run("demo.review", {"document": "Q3 report"})
    client.force_login(reviewer)
    page = client.get(reverse("admin:index")).content.decode()
    assert re.search(r"<strong>1</strong>\s*question waiting for you", page) and f'href="{PAGE}"' in page


# -- the numbers ----------------------------------------------------------------------------------
def test_an_empty_platform_shows_zeros_and_dashes(client, staff):
    payload = data(client)
    assert payload["jobs_now"] == {"pending": 0, "processing": 0, "paused": 0, "waiting": 0}
    assert set(payload["jobs_per_minute"]["series"]) == set(STATUS_COLORS)
    assert all(len(values) == 60 and not any(values) for values in payload["jobs_per_minute"]["series"].values())
    assert payload["durations"]["kinds"] == [] and payload["durations"]["p95"] is None
    assert payload["questions"]["open"] == 0 and payload["questions"]["oldest_age"] is None
    assert payload["waits"]["active"] == 0 and payload["waits"]["services"] == []
    assert tile(payload, "questions_oldest")["text"] == "–"
    page = client.get(PAGE).content.decode()
    assert "No job finished in the last 60 minutes." in page and "No active waits." in page


def test_jobs_and_their_durations_are_counted_from_the_rows(client, staff):
    completed = [run("demo.noop") for _ in range(3)]
    failed = [run("test.refuse") for _ in range(2)]
    job_submit(kind="demo.noop", input={})  # submitted, not run yet
    assert {job.status for job in completed} == {"completed"} and {job.status for job in failed} == {"failed"}
    # Runs of 0.5 s, 3 s and 45 s for the completed ones; 2 s for the failed ones.
    for job, seconds in zip(completed, (0.5, 3, 45), strict=True):
        Job.objects.filter(pk=job.pk).update(started_at=job.finished_at - timedelta(seconds=seconds))
    for job in failed:
        Job.objects.filter(pk=job.pk).update(started_at=job.finished_at - timedelta(seconds=2))

    payload = data(client)
    assert payload["jobs_now"] == {"pending": 1, "processing": 0, "paused": 0, "waiting": 0}
    totals = payload["jobs_per_minute"]["totals"]
    assert (totals["pending"], totals["processing"], totals["completed"], totals["failed"]) == (6, 5, 3, 2)
    assert totals == {status: sum(values) for status, values in payload["jobs_per_minute"]["series"].items()}
    assert totals["pending"] == JobEvent.objects.filter(type="status", status="pending").count()

    durations = payload["durations"]
    assert durations["buckets"] == ["< 1 s", "1–5 s", "5–30 s", "30 s–2 min", "2–10 min", "10 min–1 h", "≥ 1 h"]
    assert durations["series"] == {"completed": [1, 1, 0, 1, 0, 0, 0], "failed": [0, 2, 0, 0, 0, 0, 0]}
    kinds = {row["kind"]: row for row in durations["kinds"]}
    # percentile_cont interpolates: p95 of (0.5, 3, 45) is 3 + 0.9 * 42.
    assert kinds["demo.noop"] == {"kind": "demo.noop", "count": 3, "failed": 0, "p50": 3.0, "p95": 40.8, "max": 45.0,
                                  "p50_text": "3 s", "p95_text": "41 s", "max_text": "45 s"}
    assert (kinds["test.refuse"]["count"], kinds["test.refuse"]["failed"], kinds["test.refuse"]["p50"]) == (2, 2, 2.0)
    assert durations["p50"] == 2.0 and durations["p95"] == pytest.approx(3 + 0.8 * 42)

    assert tile(payload, "completed")["value"] == 3 and tile(payload, "failed") == {
        "key": "failed", "label": "Failed, last 60 min", "value": 2, "text": "2", "alert": True}
    page = client.get(PAGE).content.decode()
    assert re.search(r'data-tile="failed">\s*<span class="ops-tile-value">2</span>', page)  # without JavaScript
    assert "<td>demo.noop</td>" in page and "41 s" in page


def test_status_changes_fall_in_the_minute_they_happened():
    now = timezone.now().replace(second=30, microsecond=0)
    earlier, late = run("demo.noop"), run("test.refuse")
    JobEvent.objects.filter(job=earlier).update(created_at=now - timedelta(minutes=10))
    JobEvent.objects.filter(job=late).update(created_at=now - timedelta(seconds=20))
    JobEvent.objects.create(job=late, seq=99, type="status", status="failed")  # before the window: not counted
    JobEvent.objects.filter(job=late, seq=99).update(created_at=now - timedelta(minutes=61))

    series = jobs_per_minute(now=now)
    assert series["minutes"][-1] == now.replace(second=0).isoformat()
    assert series["labels"][-11] == (now - timedelta(minutes=10)).strftime("%H:%M")
    assert series["series"]["completed"][-11] == 1 and sum(series["series"]["completed"]) == 1
    assert series["series"]["failed"][-1] == 1 and sum(series["series"]["failed"]) == 1
    assert series["series"]["pending"][-11] == 1 and series["series"]["pending"][-1] == 1


def test_the_question_backlog_its_age_and_answer_times(client, staff):
    reviewer = make_user("rita", reviewer=True)
    answered_job, waiting_job = run("demo.review", {"document": "a"}), run("demo.review", {"document": "b"})
    assert answered_job.status == waiting_job.status == "paused"
    now = timezone.now()
    Question.objects.filter(job=waiting_job).update(opened_at=now - timedelta(minutes=40))
    answered = Question.objects.get(job=answered_job)
    Question.objects.filter(pk=answered.pk).update(opened_at=now - timedelta(minutes=2))
    question_answer(question_id=answered.pk, user=reviewer, answer={"approved": True}, channel="api")
    assert run_again(answered_job).status == "completed"

    payload = data(client)
    questions = payload["questions"]
    assert (questions["open"], questions["overdue"], questions["answered"]) == (1, 0, 1)
    assert 40 * 60 <= questions["oldest_age"] < 41 * 60 and questions["oldest_age_text"] == "40 min"
    assert questions["ages"]["counts"] == [0, 0, 1, 0, 0, 0]  # 30 min–2 h
    assert questions["ages"]["buckets"][2] == "30 min–2 h"
    assert 119 <= questions["answer_p50"] < 125
    assert (sum(questions["opened"]), sum(questions["closed"]), questions["backlog"][-1]) == (2, 1, 1)
    assert payload["jobs_now"]["paused"] == 1
    assert tile(payload, "questions_open")["value"] == 1 and tile(payload, "questions_oldest")["text"] == "40 min"


def test_the_backlog_is_rebuilt_minute_by_minute_from_the_question_events():
    reviewer = make_user("rita", reviewer=True)
    first, second = run("demo.review", {"document": "a"}), run("demo.review", {"document": "b"})
    assert first.status == second.status == "paused"
    question_answer(question_id=Question.objects.get(job=first).pk, user=reviewer, answer={"approved": True},
                    channel="api")
    now = timezone.now().replace(second=30, microsecond=0)
    # Both opened 30 minutes ago; the first was answered 5 minutes ago.
    JobEvent.objects.filter(type="question", status="open").update(created_at=now - timedelta(minutes=30))
    JobEvent.objects.filter(type="question", status="answered").update(created_at=now - timedelta(minutes=5))
    backlog = question_backlog(now=now)["backlog"]
    assert backlog[:29] == [0] * 29 and backlog[29:54] == [2] * 25 and backlog[54:] == [1] * 6


def run_again(job: Job) -> Job:
    job_execute(job_id=job.pk)
    return Job.objects.get(pk=job.pk)


def test_waits_by_service_their_age_and_the_wake_latency(client, staff, park_kind):
    parked, woken = run("ops.park"), run("ops.park")
    assert parked.status == woken.status == "waiting"
    wait = Wait.objects.get(job=woken)
    wake_token_redeem(token=wake_token(wait.token_salt))
    # The callback came 3 s before the job ran again.
    JobEvent.objects.filter(job=woken, type="wait", status="woken").update(
        created_at=timezone.now() - timedelta(seconds=3))
    assert run_again(woken).status == "completed"
    Wait.objects.filter(job=parked).update(created_at=timezone.now() - timedelta(minutes=10))

    payload = data(client)
    waits = payload["waits"]
    assert waits["active"] == 1 and 600 <= waits["oldest_age"] < 660
    assert [(row["service"], row["submitting"], row["waiting"]) for row in waits["services"]] == [("renderer", 0, 1)]
    assert waits["services"][0]["oldest_age_text"] == "10 min"
    assert waits["services"][0]["next_due_text"].startswith("in ")
    assert waits["ages"]["counts"] == [0, 1, 0, 0, 0, 0]  # 5–30 min
    latency = waits["wake_latency"]
    assert latency["count"] == 1 and 3 <= latency["p50"] < 5
    assert [(row["by"], row["count"]) for row in latency["by"]] == [("callback", 1)]
    assert payload["jobs_now"]["waiting"] == 1 and tile(payload, "waiting")["value"] == 1
    page = client.get(PAGE).content.decode()
    assert "<td>renderer</td>" in page and "<td>callback</td>" in page
