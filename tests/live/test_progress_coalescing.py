"""`ctx.progress` writes at most one row per 100 ms per run, and never drops the last report."""

from __future__ import annotations

import time
from unittest import mock

import pytest

from jobs.models import Job, JobEvent
from jobs.runner import job_execute
from jobs.runtime import JobContext
from jobs.services import job_claim, job_submit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.transitions.job_dispatch"):
        yield


def progress_rows(job) -> list[dict]:
    return list(JobEvent.objects.filter(job=job, type="progress").order_by("seq").values_list("message", flat=True))


def test_a_tight_loop_writes_few_rows_and_the_run_ends_on_its_last_report():
    job, _ = job_submit(kind="test.progress_burst", input={"reports": 5000})
    started = time.monotonic()
    assert job_execute(job_id=job.pk) == "completed"
    elapsed = time.monotonic() - started
    rows = progress_rows(job)
    # The first report is written at once, then at most one per 100 ms, plus the final flush.
    assert 2 <= len(rows) <= 2 + elapsed / JobContext.progress_interval
    assert rows[-1] == {"fraction": 1.0, "text": "report 5000"}
    job.refresh_from_db()
    assert job.progress_text == "report 5000"
    seqs = list(job.events.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, job.event_seq + 1))
    # The held report is written before the outcome: the completed status is the last event.
    assert job.events.order_by("-seq").first().status == "completed"


def test_a_held_report_goes_before_the_next_other_event():
    job, _ = job_submit(kind="demo.noop", input={})
    ctx = JobContext(job_claim(job_id=job.pk))
    ctx.progress(0.1, "first")  # written
    ctx.progress(0.2, "held")
    ctx.progress(0.3, "held, newer")  # replaces the held one
    assert progress_rows(job) == [{"fraction": 0.1, "text": "first"}]
    ctx.log("a log line")
    events = list(job.events.order_by("seq").values_list("type", "message"))
    assert events[-2:] == [("progress", {"fraction": 0.3, "text": "held, newer"}), ("log", {"text": "a log line"})]
    ctx.flush()  # nothing held any more: no new row
    assert len(progress_rows(job)) == 2


def test_reports_spaced_wider_than_the_interval_are_all_written():
    job, _ = job_submit(kind="demo.noop", input={})
    ctx = JobContext(job_claim(job_id=job.pk))
    with mock.patch.object(JobContext, "progress_interval", 0.01):
        for step in range(4):
            ctx.progress(step / 4, f"step {step}")
            time.sleep(0.02)
    assert [row["text"] for row in progress_rows(job)] == ["step 0", "step 1", "step 2", "step 3"]
    assert Job.objects.get(pk=job.pk).progress_fraction == 0.75
