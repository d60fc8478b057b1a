"""The hot paths' statements are prepared once per connection (dbkit/prepared.py)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import ApiToken
from accounts.services import api_token_create
from dbkit.kept import KeptRead
from dbkit.prepared import prepared_cursor, prepared_fetch, prepares
from jobs.services import job_claim, job_complete, job_submit

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"),
    pytest.mark.django_db,
]


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE from_sql = false")
        return [row[0] for row in cursor.fetchall()]


def _pending(count: int, monkeypatch) -> list:
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    return [job_submit(kind="demo.noop", input={})[0] for _ in range(count)]


def test_a_moves_statement_is_prepared_once_and_run_again_with_each_moves_values(monkeypatch):
    first, second = _pending(2, monkeypatch)
    job_claim(job_id=first.pk, worker="w1 pid 1", task_id="t-1")
    after_one = _prepared()
    claims = [text for text in after_one if text.startswith('WITH j AS (UPDATE "jobs_job" SET "status"')]
    assert len(claims) == 1 and "$1" in claims[0], after_one  # the values go apart from the text

    claimed = job_claim(job_id=second.pk, worker="w2 pid 2", task_id="t-2")

    assert _prepared() == after_one  # the second claim ran the prepared one
    assert (claimed.pk, claimed.worker, claimed.task_id, claimed.status) == (second.pk, "w2 pid 2", "t-2", "processing")
    first.refresh_from_db()
    assert (first.worker, first.task_id, first.status) == ("w1 pid 1", "t-1", "processing")
    assert job_complete(job=claimed, result={"n": 2}).result == {"n": 2}


def test_a_kept_read_is_prepared(submitter, settings):
    settings.KEPT_READS_CHECK = False  # that check builds every read through the ORM as well
    api_token_create(user=submitter, name="ci")
    read = KeptRead(lambda owner_id: ApiToken.objects.filter(user_id=owner_id).order_by("name"), stand_ins=(-1,))
    before = _prepared()
    assert [token.name for token in read.rows(submitter.pk, using="default")] == ["ci"]
    assert [token.name for token in read.rows(submitter.pk + 1, using="default")] == []
    added = [text for text in _prepared() if text not in before]
    assert len(added) == 1 and '"accounts_apitoken"' in added[0] and "$1" in added[0], added


def test_captured_queries_show_the_statement_with_its_values(monkeypatch):
    (job,) = _pending(1, monkeypatch)
    with CaptureQueriesContext(connection) as captured:
        job_claim(job_id=job.pk, worker="w1 pid 1", task_id="t-1")
    (query,) = captured.captured_queries
    assert job.pk.hex in query["sql"] and "'w1 pid 1'" in query["sql"] and "$1" not in query["sql"]


def test_turned_off_nothing_is_prepared_and_the_moves_still_work(monkeypatch, settings):
    settings.DATABASE_PREPARED_STATEMENTS = False
    assert not prepares(connection)
    (job,) = _pending(1, monkeypatch)
    before = _prepared()
    claimed = job_claim(job_id=job.pk, worker="w1 pid 1", task_id="t-1")
    assert claimed.status == "processing" and _prepared() == before


def test_the_cursor_reads_timestamps_in_utc():
    with prepared_cursor(connection) as cursor:
        cursor.execute("SELECT %s::timestamptz", ["2026-12-02 10:00:00+02:00"])
        (value,) = cursor.fetchone()
    assert value.utcoffset().total_seconds() == 0 and value.hour == 8


def test_debug_records_the_statements_only_when_asked(settings):
    """Under DEBUG (`make run`'s web process) Django would record every statement's SQL with its
    values written in; the backend does so only with DATABASE_RECORD_QUERIES. A test capturing
    them always gets them."""
    settings.DEBUG = True
    settings.DATABASE_RECORD_QUERIES = False
    connection.queries_log.clear()
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s", [1])
    assert connection.queries == []
    with CaptureQueriesContext(connection) as captured:
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s", [2])
    assert [query["sql"] for query in captured.captured_queries] == ["SELECT 2"]
    settings.DATABASE_RECORD_QUERIES = True
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s", [3])
    assert [query["sql"] for query in connection.queries][-1:] == ["SELECT 3"]


def test_the_cursor_is_kept_for_the_next_block_and_a_block_inside_gets_its_own():
    with prepared_cursor(connection) as outer:
        kept = outer.cursor
        outer.execute("SELECT generate_series(1, %s)", [3])
        assert outer.fetchone() == (1,)
        with prepared_cursor(connection) as inner:
            assert inner.cursor is not kept  # the outer block's rows are not yet read
            inner.execute("SELECT %s::int", [7])
            assert inner.fetchone() == (7,)
        assert inner.cursor.closed and not kept.closed
        assert outer.fetchall() == [(2,), (3,)]
    with prepared_cursor(connection) as again:
        assert again.cursor is kept
        again.execute("SELECT %s::int", [8])
        assert again.fetchone() == (8,)


def test_a_block_that_failed_gives_the_cursor_back():
    from django.db import DatabaseError, transaction

    with prepared_cursor(connection) as first:
        kept = first.cursor
    with pytest.raises(DatabaseError), transaction.atomic(), prepared_cursor(connection) as failing:
        failing.execute("SELECT 1 / %s", [0])
    with prepared_cursor(connection) as after:
        assert after.cursor is kept
        after.execute("SELECT %s::int", [1])
        assert after.fetchone() == (1,)


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_gets_a_new_cursor():
    with prepared_cursor(connection) as first:
        kept = first.cursor
    old = connection.connection
    connection.close()
    with prepared_cursor(connection) as after:
        assert connection.connection is not old and after.cursor is not kept
        after.execute("SELECT %s::int", [2])
        assert after.fetchone() == (2,)


def test_a_named_statement_keeps_its_own_cursor_and_its_adapters_between_other_statements():
    """Alternating two statements on one cursor made psycopg work out each one's dumpers and
    loaders again every time (its `Transformer`, kept only while the same text runs again)."""
    claim, outcome = "SELECT %s::int, now()", "SELECT %s::text, %s::bigint"
    adapters = {}
    for round_ in range(3):
        with prepared_cursor(connection, claim) as cursor:
            cursor.execute(claim, [round_])
            assert cursor.fetchone()[0] == round_
            adapters.setdefault(claim, set()).add((id(cursor.cursor), id(cursor.cursor._tx)))
        with prepared_cursor(connection, outcome) as cursor:
            cursor.execute(outcome, [str(round_), 7])
            assert cursor.fetchone() == (str(round_), 7)
            adapters.setdefault(outcome, set()).add((id(cursor.cursor), id(cursor.cursor._tx)))
    assert all(len(kept) == 1 for kept in adapters.values()), adapters  # one cursor, one Transformer each
    assert adapters[claim] != adapters[outcome]


def test_a_named_statement_inside_a_block_running_it_gets_a_cursor_of_its_own():
    statement = "SELECT generate_series(1, %s)"
    with prepared_cursor(connection, statement) as outer:
        outer.execute(statement, [3])
        assert outer.fetchone() == (1,)
        with prepared_cursor(connection, statement) as inner:
            assert inner.cursor is not outer.cursor
            inner.execute(statement, [1])
            assert inner.fetchall() == [(1,)]
        with prepared_cursor(connection) as other:  # the unnamed cursor is free: lent as usual
            assert other.cursor is not outer.cursor
        assert inner.cursor.closed and outer.fetchall() == [(2,), (3,)]
    with prepared_cursor(connection, statement) as again:
        assert again.cursor is outer.cursor


def test_past_the_bound_the_idle_cursors_are_closed_and_a_lent_one_is_kept(monkeypatch):
    from dbkit import prepared

    monkeypatch.setattr(prepared, "MAX_STATEMENT_CURSORS", 3)
    made = []
    with prepared_cursor(connection, "SELECT 0") as held:
        for number in range(1, 4):
            with prepared_cursor(connection, f"SELECT {number}") as cursor:
                made.append(cursor.cursor)
        held.execute("SELECT %s::int", [5])  # the cursor the block holds still works
        assert held.fetchone() == (5,) and not held.cursor.closed
    kept = connection.__dict__[prepared.KEPT]
    assert len(kept.cursors) <= 3 and "SELECT 0" in kept.cursors
    assert made[0].closed and not made[-1].closed  # the bound was reached when the third one came


def test_a_moves_whole_statement_is_the_same_string_each_time(monkeypatch):
    """What lets the move's cursor keep its adapters: the claim's text, as psycopg is given it,
    is one object from one claim to the next."""
    seen = []
    first, second = _pending(2, monkeypatch)
    real = prepared_fetch

    def recording(conn, statement, params, **kwargs):
        seen.append(statement)
        return real(conn, statement, params, **kwargs)

    monkeypatch.setattr("jobs.models.prepared_fetch", recording)
    job_claim(job_id=first.pk, worker="w1 pid 1", task_id="t-1")
    job_claim(job_id=second.pk, worker="w1 pid 1", task_id="t-2")
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].startswith("WITH j AS (UPDATE")


def test_one_jobs_submit_is_the_same_string_each_time(monkeypatch):
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    seen = []
    real = prepared_fetch

    def recording(conn, statement, params, **kwargs):
        seen.append(statement)
        return real(conn, statement, params, **kwargs)

    monkeypatch.setattr("jobs.events.prepared_fetch", recording)
    first, _ = job_submit(kind="demo.noop", input={})
    second, _ = job_submit(kind="demo.noop", input={})
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].startswith("WITH j AS (INSERT")
    second.refresh_from_db()
    assert first.pk != second.pk and second.status == "pending"


# `prepared_fetch`: the kept cursor run without Django's wrapper, and Django's checks kept.

STATEMENT = "SELECT %s::int + 1"


def _fast_path_only(monkeypatch) -> None:
    """From here on, a statement that would go through `prepared_cursor` (the wrapper) fails."""
    def refused(*args, **kwargs):
        raise AssertionError("went through prepared_cursor")

    monkeypatch.setattr("dbkit.prepared.prepared_cursor", refused)


def test_a_statement_run_again_goes_on_its_kept_cursor_without_a_wrapper(monkeypatch):
    assert prepared_fetch(connection, STATEMENT, [1], one=True) == (2,)  # the first: made and kept
    kept = connection.__dict__["_taskplatform_prepared_cursor"].cursors[STATEMENT]
    _fast_path_only(monkeypatch)
    assert prepared_fetch(connection, STATEMENT, [2], one=True) == (3,)
    assert prepared_fetch(connection, STATEMENT, [3]) == [(4,)]
    assert connection.__dict__["_taskplatform_prepared_cursor"].cursors[STATEMENT] is kept
    assert any(text.startswith("SELECT $1::int + 1") for text in _prepared())


def test_its_errors_are_djangos_and_a_broken_transaction_is_refused(monkeypatch):
    from django.db import DataError, transaction
    from django.db.transaction import TransactionManagementError

    divide = "SELECT 1 / %s::int"
    assert prepared_fetch(connection, divide, [1], one=True) == (1,)
    _fast_path_only(monkeypatch)
    with transaction.atomic():
        with pytest.raises(DataError), transaction.atomic(savepoint=False):
            prepared_fetch(connection, divide, [0], one=True)  # psycopg's DivisionByZero, as Django's cursor raises it
        with pytest.raises(TransactionManagementError):  # the block is broken: nothing more runs in it
            prepared_fetch(connection, divide, [1], one=True)
    assert prepared_fetch(connection, divide, [1], one=True) == (1,)


def test_django_sees_it_when_it_logs_or_wraps_statements():
    assert prepared_fetch(connection, STATEMENT, [1], one=True) == (2,)
    with CaptureQueriesContext(connection) as captured:
        assert prepared_fetch(connection, STATEMENT, [41], one=True) == (42,)
    assert [query["sql"] for query in captured.captured_queries] == ["SELECT 41::int + 1"]
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        assert prepared_fetch(connection, STATEMENT, [5], one=True) == (6,)
    assert seen == [(STATEMENT, [5])]


def test_a_tool_that_patched_djangos_cursor_wrapper_still_sees_the_statement(monkeypatch):
    """An APM's Django integration traces SQL by replacing `CursorWrapper.execute`."""
    from django.db.backends.utils import CursorWrapper

    assert prepared_fetch(connection, STATEMENT, [1], one=True) == (2,)
    seen, djangos = [], CursorWrapper.execute

    def traced(self, sql, params=None):
        seen.append(sql)
        return djangos(self, sql, params)

    monkeypatch.setattr(CursorWrapper, "execute", traced)
    assert prepared_fetch(connection, STATEMENT, [2], one=True) == (3,)
    assert seen == [STATEMENT]
    monkeypatch.undo()
    assert prepared_fetch(connection, STATEMENT, [3], one=True) == (4,)
    assert seen == [STATEMENT]  # Django's own again: the kept cursor, no wrapper


def test_inside_a_block_holding_its_cursor_it_gets_a_cursor_of_its_own():
    assert prepared_fetch(connection, "SELECT generate_series(1, %s)", [1]) == [(1,)]
    with prepared_cursor(connection, "SELECT generate_series(1, %s)") as outer:
        outer.execute("SELECT generate_series(1, %s)", [3])
        assert outer.fetchone() == (1,)
        assert prepared_fetch(connection, "SELECT generate_series(1, %s)", [2]) == [(1,), (2,)]
        assert outer.fetchall() == [(2,), (3,)]  # the outer block's rows were not lost


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_health_check_closes_is_replaced_and_its_cursor_made_again(settings):
    assert prepared_fetch(connection, STATEMENT, [1], one=True) == (2,)
    old = connection.connection
    connection.health_check_enabled, connection.health_check_done = True, False
    old.close()  # what the server dropping it looks like to the check
    try:
        assert prepared_fetch(connection, STATEMENT, [2], one=True) == (3,)
    finally:
        connection.health_check_enabled = False
    assert connection.connection is not old
    assert connection.__dict__["_taskplatform_prepared_cursor"].raw is connection.connection


def test_from_another_thread_it_is_refused_as_djangos_cursor_refuses(monkeypatch):
    import threading

    from django.db import DatabaseError, connections

    shared, raised = connections["default"], []  # this thread's connection, used from another
    assert prepared_fetch(shared, STATEMENT, [1], one=True) == (2,)  # its cursor kept

    def use() -> None:
        try:
            prepared_fetch(shared, STATEMENT, [1], one=True)
        except DatabaseError as exc:
            raised.append(exc)

    thread = threading.Thread(target=use)
    thread.start()
    thread.join()
    assert raised and "thread" in str(raised[0]), raised
