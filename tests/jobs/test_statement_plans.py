"""A move names its job by id, and PostgreSQL must find that one row through the primary key,
however the table's statistics look (`jobs.models.status_among`).

The trap: the planner's statistics were taken while few jobs waited (a new table, a quiet
night), so it takes `status = 'pending'` for one row, and answers `id = X AND status = 'pending'`
through the `(status, run_after)` index, filtering on the id. Then a backlog comes, and every
claim reads every pending job: with 3,000 queued, each claim read 3,000 rows, and the worker ran a
fifth as fast as it does now. The test builds that situation and reads the plans of the
statements a run sends: the claim, a progress report, a step and the outcome.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.events import event_append, step_begin
from jobs.models import Job
from jobs.services import job_claim, job_complete, jobs_submit_many

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner"),
    pytest.mark.django_db(transaction=True),
]

BACKLOG = 400


def _scans(plan: dict) -> list[tuple[str, str | None]]:
    """(node type, index name) of every scan of jobs_job in an EXPLAIN (FORMAT JSON) plan."""
    found = []
    if plan.get("Relation Name") == "jobs_job" and "Scan" in plan["Node Type"]:
        found.append((plan["Node Type"], plan.get("Index Name")))
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _plan(sql: str) -> list[tuple[str, str | None]]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        (document,) = cursor.fetchone()
    document = json.loads(document) if isinstance(document, str) else document
    return _scans(document[0]["Plan"])


@pytest.fixture
def backlog(monkeypatch):
    """Statistics taken when no job waited, then a backlog of pending jobs (never sent)."""
    monkeypatch.setattr("jobs.services.transitions.jobs_dispatch", lambda jobs: None)
    done = jobs_submit_many(kind="demo.noop", inputs=[{}] * 50)
    Job.objects.filter(pk__in=[job.pk for job in done]).update(status="completed")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    return jobs_submit_many(kind="demo.noop", inputs=[{}] * BACKLOG)


def test_every_statement_of_a_run_finds_its_job_by_the_primary_key(backlog):
    job = backlog[-1]
    with CaptureQueriesContext(connection) as run:
        claimed = job_claim(job_id=job.pk, worker="w", task_id="t")
        event_append(job_id=job.pk, type="progress", message={"text": "half"}, run_attempt=claimed.attempts,
                     fields={"progress_fraction": 0.5})
        job_complete(job=claimed, result={"ok": True})
    writes = [query["sql"] for query in run.captured_queries if "jobs_job" in query["sql"]
              and query["sql"].lstrip().upper().startswith(("UPDATE", "WITH"))]
    assert len(writes) == 3, writes
    with transaction.atomic():  # EXPLAIN plans the statements without running them
        for sql in writes:
            assert _plan(sql) == [("Index Scan", "jobs_job_pkey")], sql[:300]


def test_a_step_finds_its_job_by_the_primary_key(backlog):
    job = backlog[0]
    claimed = job_claim(job_id=job.pk, worker="w", task_id="t")
    with CaptureQueriesContext(connection) as run:
        step_begin(job_id=job.pk, run_attempt=claimed.attempts, step="fetch")
    writes = [query["sql"] for query in run.captured_queries if query["sql"].lstrip().upper().startswith(
        ("UPDATE", "WITH"))]
    assert writes
    with transaction.atomic():
        for sql in writes:
            assert _plan(sql) == [("Index Scan", "jobs_job_pkey")], sql[:300]
