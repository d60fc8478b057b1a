"""A new pool process rehearses a run's moves against no job before its first job
(`jobs.runner.moves_rehearse`, called by `jobs.tasks.connect_before_the_first_job`): the first job
then builds none of its statements and finds them prepared, and the rehearsal writes nothing.
Bounded by short timeouts, and a failure is only logged."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest
from django.db import connection

from jobs import runner, statements
from jobs.models import Job, JobEvent
from jobs.runner import job_execute, moves_rehearse
from jobs.services.submitting import job_submit
from tests.support import processes
from tests.support.statements import count_builds

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the rehearsal is PostgreSQL's (prepared statements)"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def new_process(monkeypatch):
    """This process as a new pool process finds it: no statement kept, a new connection."""
    monkeypatch.setattr(statements, "_kept", {})
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    connection.close()
    yield
    connection.close()


def _prepared() -> set[str]:
    """The statements of a run's moves prepared on this connection (the submits' are not)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return {row[0] for row in cursor.fetchall() if 'UPDATE "jobs_job"' in row[0]}


def _run_one(kind: str, owner=None, input=None) -> None:
    job, _ = job_submit(kind=kind, input=input or {}, owner=owner)
    assert job_execute(job_id=job.pk, worker="w", worker_hostname="w", task_id="t") == "completed"


def test_after_the_rehearsal_the_first_job_builds_no_statement(new_process, monkeypatch, reviewer):
    rows = (Job.objects.count(), JobEvent.objects.count())
    moves_rehearse()
    assert (Job.objects.count(), JobEvent.objects.count()) == rows, "the rehearsal wrote something"
    assert not connection.in_atomic_block
    prepared = _prepared()
    # The claim, a step's begin and checkpoint, a progress report, two completions.
    assert len(prepared) >= 6, prepared

    built = count_builds(monkeypatch)
    _run_one("demo.noop")  # no owner: the claim and the completion
    _run_one("demo.noop", owner=reviewer)  # an owner: its completion's statement too
    # A step, a progress report with its text and a result that is not empty (`{}` and `""` are
    # constants of their statements: shapes of their own).
    _run_one("demo.sleep", input={"seconds": 0, "steps": 1})
    _run_one("demo.sleep", owner=reviewer, input={"seconds": 0, "steps": 1})
    assert built == [], "the first jobs built statements the rehearsal should have"
    assert _prepared() == prepared, "the first jobs prepared statements the rehearsal should have"


def test_without_the_rehearsal_the_first_job_builds_its_statements(new_process, monkeypatch):
    # What the rehearsal saves, shown by its absence: this fails if nothing is built at all.
    built = count_builds(monkeypatch)
    _run_one("demo.noop")
    assert len(built) == 2  # the claim and the completion


def test_a_rehearsal_that_meets_a_locked_table_gives_up_in_time(new_process, caplog):
    locked, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with psycopg.connect(processes.test_database_url()) as other:
            other.execute(f"LOCK TABLE {Job._meta.db_table} IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)
            other.rollback()

    holder = threading.Thread(target=hold_the_lock, daemon=True)
    holder.start()
    assert locked.wait(10)
    try:
        with caplog.at_level(logging.WARNING, logger="jobs.runner"):
            started = time.monotonic()
            moves_rehearse()
            took = time.monotonic() - started
    finally:
        release.set()
        holder.join(10)
    assert took < runner.REHEARSAL_TIMEOUT_MS / 1000 * 3, took  # the first statement's timeout, not the lock's end
    assert "could not rehearse" in caplog.text
    assert not connection.in_atomic_block
    with connection.cursor() as cursor:  # the connection is usable afterwards
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_a_refused_outcome_keeps_the_statements_prepared(new_process):
    """A run whose job was cancelled meanwhile has its outcome refused: that writes nothing and
    rolls nothing back, so the connection keeps its prepared statements (psycopg drops them all
    at a rollback)."""
    from jobs.errors import InvalidTransition
    from jobs.services import job_cancel, job_claim, job_complete

    job, _ = job_submit(kind="demo.noop", input={})
    claimed = job_claim(job_id=job.pk, worker="w", task_id="t")
    prepared = _prepared()
    assert prepared, "the claim was not prepared"
    job_cancel(job_id=job.pk)
    with pytest.raises(InvalidTransition):
        job_complete(job=claimed, result={})
    assert prepared <= _prepared()
    assert Job.objects.get(pk=job.pk).status == "cancelled"
