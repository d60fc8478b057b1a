"""What a wake callback costs PostgreSQL, counted: each statement is a round trip between the
callback and the job's resume (bench/shipped.py's wake→running figure)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobs.models import Job, JobEvent
from jobs.services import job_submit
from tests.support.runs import run
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import wake_token

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one-statement moves"),
    pytest.mark.django_db,
]


def test_a_callback_reads_its_wait_twice_and_writes_its_row_once(monkeypatch):
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    job, _ = job_submit(kind="demo.noop", input={})
    park = lambda ctx: ctx.wait_for("a", submit=lambda token, url: "ext-a", check=lambda _: CheckResult.pending())  # noqa: E731
    assert run(job.pk, park) == "waiting"
    token = wake_token(Wait.objects.get(job=job).token_salt)
    with CaptureQueriesContext(connection) as wake:
        response = Client().post(f"/api/wake/{token}/")
    assert response.status_code == 202, response.content
    statements = [query["sql"] for query in wake.captured_queries]
    # The token spent and the wait woken in one UPDATE of its row, not two.
    assert sum(sql.startswith('UPDATE "waits_wait"') for sql in statements) == 1, statements
    # Its job's id by the token; (the test's savepoint); the job's lock; the wait's under its lock;
    # the wait's row; the job's move with the woken event and its own; (the savepoint's release).
    assert len(statements) <= 7, "\n".join(sql[:120] for sql in statements)
    # The woken event is written by the move's statement, not by one of its own.
    assert sum(sql.startswith('WITH j AS (UPDATE "jobs_job"') for sql in statements) == 1, statements
    wait = Wait.objects.get(job=job)
    assert wait.token_used_at is not None and wait.token_used_at == wait.woken_at
    assert Job.objects.get(pk=job.pk).status == Job.Status.PENDING
    assert list(JobEvent.objects.filter(job=job).order_by("seq").values_list("type", "status"))[-2:] == [
        ("wait", "woken"), ("status", "pending")]


def test_a_callback_before_the_run_parked_still_writes_its_woken_event(monkeypatch):
    """The wake's move is refused (the job is not waiting yet): the event is written on its own."""
    from waits.services import wake_token_redeem

    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    job, _ = job_submit(kind="demo.noop", input={})
    park = lambda ctx: ctx.wait_for("a", submit=lambda token, url: "ext-a", check=lambda _: CheckResult.pending())  # noqa: E731
    assert run(job.pk, park) == "waiting"
    Job.objects.filter(pk=job.pk).update(status=Job.Status.PROCESSING)  # as if the run had not parked yet
    seq = Job.objects.get(pk=job.pk).event_seq
    wake_token_redeem(token=wake_token(Wait.objects.get(job=job).token_salt))
    stored = Job.objects.get(pk=job.pk)
    assert stored.status == Job.Status.PROCESSING and stored.event_seq == seq + 1
    assert list(JobEvent.objects.filter(job=job, seq__gt=seq).values_list("seq", "type", "status")) == [
        (seq + 1, "wait", "woken")]
    assert Wait.objects.get(job=job).woken_at is not None
