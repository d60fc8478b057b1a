"""The hot paths' statements are prepared once per connection (dbkit/prepared.py)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import ApiToken
from accounts.services import api_token_create
from dbkit.kept import KeptRead
from dbkit.prepared import prepared_cursor, prepares
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
    real = prepared_cursor

    def recording(conn, statement=None):
        seen.append(statement)
        return real(conn, statement)

    monkeypatch.setattr("jobs.models.prepared_cursor", recording)
    job_claim(job_id=first.pk, worker="w1 pid 1", task_id="t-1")
    job_claim(job_id=second.pk, worker="w1 pid 1", task_id="t-2")
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].startswith("WITH j AS (UPDATE")


def test_one_jobs_submit_is_the_same_string_each_time(monkeypatch):
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    seen = []
    real = prepared_cursor

    def recording(conn, statement=None):
        seen.append(statement)
        return real(conn, statement)

    monkeypatch.setattr("jobs.events.prepared_cursor", recording)
    first, _ = job_submit(kind="demo.noop", input={})
    second, _ = job_submit(kind="demo.noop", input={})
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].startswith("WITH j AS (INSERT")
    second.refresh_from_db()
    assert first.pk != second.pk and second.status == "pending"
