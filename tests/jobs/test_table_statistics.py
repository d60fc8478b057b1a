"""A connection that planned its foreign-key checks while the jobs table held a row keeps a
sequential scan after the table has grown, until the table's statistics change
(`dbkit.statistics`, `jobs.services.reconciling.jobs_statistics_refresh`).

The test is that situation as a new installation meets it: a job or two run, a connection of
their own (a pool process's) has written their events, then thousands of jobs come. Each event
that connection writes then checks its job with a scan of the whole table, until the statistics
are taken again: by the reconciler's pass, or by the batch submit itself.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from django.db import connection

from dbkit import statistics
from jobs.events import jobs_create_with_first_events
from jobs.models import Job
from jobs.services import jobs_statistics_refresh, jobs_submit_many
from tests.support import processes

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans and statistics"),
    pytest.mark.django_db(transaction=True),
]

GROWN = 2000  # jobs added after the worker's connection planned
CHECKED = 100  # events written (and so jobs checked) by it after that


@pytest.fixture
def no_autovacuum():
    """Autovacuum may analyse the tables at any moment of its minute: not during this test."""
    with connection.cursor() as cursor:
        for table in ("jobs_job", "jobs_jobevent"):
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for table in ("jobs_job", "jobs_jobevent"):
                cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


@pytest.fixture
def worker(monkeypatch, no_autovacuum):
    """A connection of its own, as a pool process's, that wrote events while one job existed:
    its foreign-key check's plan is then made (and kept) for a table of one row."""
    monkeypatch.setattr("jobs.services.transitions.jobs_dispatch", lambda jobs: None)
    (first,) = jobs_submit_many(kind="demo.noop", inputs=[{}])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")  # a table analysed while it held one row (or autovacuum's)
    with contextlib.closing(psycopg.connect(processes.test_database_url(), autocommit=True)) as conn:
        for seq in range(2, 12):  # more than the five custom plans before a generic one is kept
            _event(conn, first.pk, seq)
        yield conn


def _event(conn, job_id, seq: int) -> None:
    conn.execute("INSERT INTO jobs_jobevent (job_id, seq, type, step, status, message, created_at) "
                 "VALUES (%s, %s, 'log', '', '', '{}', now())", [job_id, seq])


def _scans_of_checks(conn, job_ids: list) -> tuple[int, int]:
    """(sequential, index) scans of jobs_job while `conn` writes an event for each of `job_ids`,
    their foreign keys checked at once. Read from the counters this connection has not sent yet
    (`pg_stat_xact_user_tables`), before and after, in one transaction."""
    counters = "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'jobs_job'"
    with conn.transaction():
        conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
        before = conn.execute(counters).fetchone()
        for job_id in job_ids:
            _event(conn, job_id, 100)
        after = conn.execute(counters).fetchone()
    return after[0] - before[0], after[1] - before[1]


def _grow_without_statistics(count: int) -> list:
    """`count` pending jobs written as the batch submit writes them, minus its statistics."""
    jobs = jobs_create_with_first_events(
        shared={"kind": "demo.noop", "owner_id": None, "idempotency_key": None, "max_attempts": 1, "parent_id": None,
                "spawn_key": None},
        each=("input",), rows=[({},)] * count)
    with connection.cursor() as cursor:
        # The activity counters the reconciler reads, as the writers' connections send them within
        # a second of going idle; here at once.
        cursor.execute("SELECT pg_stat_force_next_flush()")
    return [job.pk for job in jobs]


def test_a_plan_made_on_a_tiny_table_scans_it_until_the_reconciler_takes_its_statistics(worker):
    grown = _grow_without_statistics(GROWN)

    sequential, _ = _scans_of_checks(worker, grown[:CHECKED])
    assert sequential >= CHECKED  # the situation: each check reads the whole table

    assert "jobs_job" in jobs_statistics_refresh()  # the reconciler's pass

    sequential, by_index = _scans_of_checks(worker, grown[CHECKED:2 * CHECKED])
    assert (sequential, by_index) == (0, CHECKED)
    assert jobs_statistics_refresh() == []  # taken: nothing more until the table grows fourfold


def test_a_batch_submit_into_a_young_table_takes_its_statistics(worker):
    grown = [job.pk for job in jobs_submit_many(kind="demo.noop", inputs=[{}] * GROWN)]

    sequential, by_index = _scans_of_checks(worker, grown[:CHECKED])
    assert (sequential, by_index) == (0, CHECKED)


def _step_begins_scans(conn, job_id, names: list[str]) -> tuple[int, int]:
    """(sequential, index) scans of jobs_jobstep while `conn` tests, as a step's begin does, that
    `job_id` has no finished step of each of `names` (a prepared statement, as a pool process's)."""
    counters = "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'jobs_jobstep'"
    with conn.transaction():
        before = conn.execute(counters).fetchone()
        for name in names:
            conn.execute("SELECT 1 FROM jobs_job j WHERE j.id = %s AND NOT EXISTS "
                         "(SELECT 1 FROM jobs_jobstep s WHERE s.job_id = j.id AND s.name = %s)", [job_id, name],
                         prepare=True)
        after = conn.execute(counters).fetchone()
    return after[0] - before[0], after[1] - before[1]


def test_a_step_begins_plan_made_on_a_tiny_steps_table_is_made_again_once_the_table_grew(worker, monkeypatch):
    """A pool process's connection keeps its step's begin (a test for a finished step of that
    name) planned while the steps' table held nothing: a scan of the whole table at every step,
    until the reconciler's pass takes the table's statistics again."""
    from jobs.models import JobStep

    job_id = Job.objects.values_list("pk", flat=True).first()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobs_jobstep SET (autovacuum_enabled = false)")
        cursor.execute("ANALYZE jobs_jobstep")
    try:
        names = [f"s{index}" for index in range(CHECKED)]
        _step_begins_scans(worker, job_id, names[:10])  # planned: five custom plans, then a generic one kept
        JobStep.objects.bulk_create([JobStep(job_id=job_id, name=f"grown {index}", result=index, attempt=1)
                                     for index in range(GROWN)])
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        sequential, _ = _step_begins_scans(worker, job_id, names)
        assert sequential >= CHECKED  # the situation: each step's test reads the whole table

        assert "jobs_jobstep" in jobs_statistics_refresh()  # the reconciler's pass

        sequential, by_index = _step_begins_scans(worker, job_id, names)
        assert (sequential, by_index) == (0, CHECKED)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobs_jobstep RESET (autovacuum_enabled)")


def test_small_tables_and_tables_in_step_with_their_statistics_are_left_alone(no_autovacuum):
    assert jobs_statistics_refresh() == []  # empty
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    assert jobs_statistics_refresh(rows_added=statistics.MINIMUM_ROWS - 1) == []
    assert set(jobs_statistics_refresh(rows_added=statistics.MINIMUM_ROWS)) == {"jobs_job", "jobs_jobevent"}


def test_inside_a_transaction_nothing_is_analysed():
    from django.db import transaction

    with transaction.atomic():
        assert statistics.tables_analyze_if_grown(["jobs_job"], rows_added=10 * statistics.MINIMUM_ROWS) == []


@pytest.mark.parametrize(("counted", "live", "outgrown"), [
    (-1, 499, False), (-1, 500, True), (0, 500, True), (200, 800, False), (200, 801, True),
    (10_000, 39_999, False), (10_000, 40_001, True),
])
def test_outgrown_from_500_rows_at_four_times_the_statistics(counted, live, outgrown):
    assert statistics._outgrown(counted=counted, live=live) is outgrown


def test_a_table_this_role_does_not_own_is_left_alone(no_autovacuum):
    """PostgreSQL refuses to analyse it (a warning): it is not asked to, at every pass."""
    role = "taskplatform_test_not_owner"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP ROLE IF EXISTS {role}")
        cursor.execute(f"CREATE ROLE {role}")
        try:
            cursor.execute(f"GRANT SELECT ON jobs_job, jobs_jobevent TO {role}")
            cursor.execute(f"SET ROLE {role}")
            try:
                assert statistics.tables_analyze_if_grown(["jobs_job"], rows_added=10 * statistics.MINIMUM_ROWS) == []
            finally:
                cursor.execute("RESET ROLE")
            assert statistics.tables_analyze_if_grown(["jobs_job"], rows_added=10 * statistics.MINIMUM_ROWS) == [
                "jobs_job"]
        finally:
            cursor.execute(f"REVOKE ALL ON jobs_job, jobs_jobevent FROM {role}")
            cursor.execute(f"DROP ROLE {role}")


def test_a_failed_analyse_fails_neither_the_submit_nor_the_pass(monkeypatch, no_autovacuum, caplog):
    """The batch's jobs are committed and sent before the statistics are looked at: an error
    there must not tell the operator that the submit failed (they would submit again)."""
    from django.db import DatabaseError

    monkeypatch.setattr("jobs.services.transitions.jobs_dispatch", lambda jobs: None)

    def refuse_analyse(execute, sql, params, many, context):
        if sql.startswith("ANALYZE"):
            raise DatabaseError("canceling statement due to statement timeout")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse_analyse):
        jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * statistics.MINIMUM_ROWS)
        assert jobs_statistics_refresh() == []
    assert Job.objects.filter(pk__in=[job.pk for job in jobs]).count() == statistics.MINIMUM_ROWS
    assert "were not taken again: DatabaseError: canceling statement" in caplog.text
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # the counters the next pass reads
    assert set(jobs_statistics_refresh()) == {"jobs_job", "jobs_jobevent"}  # the next pass does it
