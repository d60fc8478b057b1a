"""One presenter words every event (`jobs.presenters.event_text`), and its sentence travels with
the event as `text` in every JSON the platform sends (the websocket's, SSE's, the events API's);
durations and times read as people say them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest

from jobs.models import JobEvent
from jobs.presenters import duration_short, event_text, json_block, time_left, time_with_age
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user


@pytest.mark.parametrize("event, text", [
    ({"type": "progress", "message": {"fraction": 0.0333333333, "text": "step 1 of 30"}}, "3 % · step 1 of 30"),
    ({"type": "progress", "message": {"fraction": 1}}, "100 %"),
    ({"type": "status", "status": "pending", "message": {}}, "Submitted; waiting for a worker"),
    ({"type": "status", "status": "processing", "message": {}}, "Running"),
    ({"type": "status", "status": "paused", "message": {"question": "approve"}},
     "Paused: waiting for an answer to “approve”"),
    ({"type": "status", "status": "pending", "message": {"answered": "approve"}},
     "Question “approve” answered; queued to resume"),
    ({"type": "status", "status": "pending", "message": {
        "error": {"code": "exception", "message": "RuntimeError: boom"}, "retry_in": 2.5, "attempt": 1}},
     "Attempt 1 failed (exception — RuntimeError: boom); retrying in 2.5 s"),
    ({"type": "status", "status": "pending", "message": {"lease_expired": True, "attempt": 2, "error": "x"}},
     "The worker of attempt 2 was lost; queued again"),
    ({"type": "status", "status": "pending", "message": {"handed_back": True, "reason": "shutdown", "attempt": 1}},
     "Handed back by its worker (shutdown); queued again"),
    ({"type": "status", "status": "waiting", "message": {"wait": "generate", "reason": "accepted"}},
     "Parked: waiting on “generate” (accepted)"),
    ({"type": "status", "status": "failed", "message": {"error": {"code": "timeout", "message": "took 301 s"}}},
     "Failed: timeout — took 301 s"),
    ({"type": "status", "status": "cancelled", "message": {"by": "boss"}}, "Cancelled by boss"),
    ({"type": "status", "status": "completed", "message": {}}, "Completed"),
    ({"type": "step", "step": "draft", "status": "completed", "message": {}}, "Step “draft” done"),
    ({"type": "step", "step": "draft", "status": "skipped", "message": {}}, "Step “draft” skipped: already done"),
    ({"type": "step", "step": "upload", "status": "failed", "message": {"error": "OSError: disk full"}},
     "Step “upload” failed: OSError: disk full"),
    ({"type": "question", "step": "approve", "status": "open", "message": {
        "assignees": ["group:reviewers"], "round": 1, "expires_at": "2026-12-01T11:22:05.123Z"}},
     "Question “approve” asked of group:reviewers; answer by 11:22:05 UTC"),
    ({"type": "question", "step": "approve", "status": "answered", "message": {
        "by": "rita", "channel": "web", "answer": {"approved": False, "reason": "totals are wrong"}}},
     "Question “approve” answered by rita: rejected: totals are wrong"),
    ({"type": "question", "step": "approve", "status": "voted", "message": {"by": "rev2", "approvals": 1,
                                                                            "required": 2}},
     "rev2 approved “approve” (1 of 2)"),
    ({"type": "question", "step": "q", "status": "expired", "message": {"on_timeout": "fail"}},
     "Question “q” expired; then fail"),
    ({"type": "wait", "step": "generate", "status": "parked", "message": {
        "reason": "accepted", "service": "simulated generation", "next_check_at": "2026-12-01T11:23:05Z"}},
     "Waiting on simulated generation for “generate” (accepted); next check 11:23:05 UTC"),
    ({"type": "wait", "step": "generate", "status": "woken", "message": {"by": "callback"}},
     "Wait “generate” woken by callback"),
    ({"type": "wait", "step": "generate", "status": "done", "message": {"checks": 1}},
     "Wait “generate” done after 1 check"),
    ({"type": "log", "status": "info", "message": {"text": "fetched 3 rows"}}, "fetched 3 rows"),
    ({"type": "log", "status": "warning", "message": {"text": "slow"}}, "Warning: slow"),
])
def test_each_event_type_reads_as_one_short_sentence(event, text):
    assert event_text(event) == text


def test_an_event_of_an_unexpected_shape_still_reads_as_something():
    assert event_text({"type": "progress", "message": {"fraction": "lots"}}) == "Progress"
    assert event_text({"type": "step", "step": "a", "status": "failed", "message": ["not", "a", "dict"]}) == (
        "Step “a” failed")
    assert event_text({"type": "status", "status": "failed", "message": {"error": "x" * 1000}}).endswith("…")
    assert event_text({"type": "custom", "status": "odd"}) == "custom odd"


@pytest.mark.django_db
def test_every_event_json_carries_the_sentence(client):
    owner = make_user("olga")
    with mock.patch("jobs.services.transitions.job_dispatch"):
        job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 2}, owner=owner)
        assert job_execute(job_id=job.pk) == "completed"
    events = list(JobEvent.objects.filter(job=job).order_by("seq"))
    pushed = [event.as_dict() for event in events]  # what the websocket, SSE and the broadcast send
    assert [event["text"] for event in pushed] == [event_text(event) for event in pushed]
    assert "50 % · step 1 of 2" in [event["text"] for event in pushed]
    client.force_login(owner)
    api = client.get(f"/api/jobs/{job.pk}/events/").json()
    assert [event["text"] for event in api] == [event["text"] for event in pushed]


def test_durations_and_deadlines_read_short():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert [duration_short(s) for s in (4, 59, 61, 600, 3599, 7200, 86400 * 3)] == [
        "4 s", "59 s", "1 min", "10 min", "1 h", "2 h", "3 d"]
    assert time_left(now + timedelta(hours=2), now=now) == "in 2 h"
    assert time_left(now - timedelta(minutes=5), now=now) == "overdue 5 min"
    assert time_left(None) == ""
    assert time_with_age(now - timedelta(minutes=3, seconds=5), now=now).replace("\xa0", " ") == (
        "2026-12-01 11:56:55 UTC (3 minutes ago)")
    assert time_with_age(now, now=now) == "2026-12-01 12:00:00 UTC (just now)"
    assert time_with_age(None) == "—"


def test_long_json_is_pretty_printed_and_collapsed_beyond_a_few_lines():
    short = json_block({"seconds": 3, "steps": 30})
    assert short.startswith('<pre class="json">') and "details" not in short and "&quot;steps&quot;: 30" in short
    long = json_block({str(step): {"step": step} for step in range(1, 31)})
    assert long.startswith('<details class="json-collapsed">') and "92 lines: show all" in long
    assert long.count("&quot;30&quot;: {") == 1  # the whole, once; the preview shows only the first lines
