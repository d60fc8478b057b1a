"""Every connection reads `timestamptz` with `dbkit.postgresql`'s C-parsing loader, and it gives
exactly what Django's own loader gives: the same instant, the same `tzinfo`, the same errors."""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbkit.prepared import prepared_cursor
from jobs.models import Job
from jobs.services import job_submit

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the loader is psycopg 3's, on PostgreSQL"),
    pytest.mark.django_db,
]

UTC = datetime.UTC


def _read(sql: str, params: list, *, django_loader: bool) -> list:
    """The row `sql` returns, read by this connection's loader or, with `django_loader`, by the
    loader Django registers on a cursor (`psycopg_any.register_tzloader`)."""
    with connection.cursor() as cursor:
        if django_loader:
            register_tzloader(connection.timezone, cursor.cursor)
        cursor.execute(sql, params)
        return list(cursor.fetchone())


def _outcome(sql: str, params: list, *, django_loader: bool) -> tuple:
    try:
        row = _read(sql, params, django_loader=django_loader)
    except Exception as exc:  # the same failure, by type and message
        return ("error", type(exc).__name__, str(exc))
    return ("row", row, [value.tzinfo if isinstance(value, datetime.datetime) else None for value in row])


def test_every_cursor_reads_timestamps_with_the_fast_loader():
    from dbkit.postgresql.base import FastTzLoader

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        assert cursor.fetchone()[0].tzinfo is UTC
        loader = cursor.cursor.adapters.get_loader(1184, 0)  # timestamptz, text
    assert issubclass(loader, FastTzLoader), loader
    with prepared_cursor(connection) as cursor:
        assert issubclass(cursor.cursor.adapters.get_loader(1184, 0), FastTzLoader)
    # And a model's timestamps, through the ORM and through a job's move.
    job, _ = job_submit(kind="demo.noop", input={})
    assert Job.objects.get(pk=job.pk).created_at == job.created_at
    assert job.created_at.tzinfo is UTC


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    moment=st.datetimes(min_value=datetime.datetime(1, 1, 2), max_value=datetime.datetime(9999, 12, 30),
                        timezones=st.sampled_from([UTC, datetime.timezone(datetime.timedelta(hours=5, minutes=30)),
                                                   datetime.timezone(datetime.timedelta(hours=-8))])),
    session_zone=st.sampled_from(["UTC", "Europe/London", "Asia/Kolkata", "America/St_Johns"]),
)
def test_the_fast_loader_gives_what_djangos_gives(moment, session_zone):
    """Any instant, whatever the session's time zone says (Django sets UTC; something may set
    another), and with microseconds or without."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('TimeZone', %s, false)", [session_zone])
    try:
        sql = "SELECT %s::timestamptz, date_trunc('second', %s::timestamptz)"
        ours = _outcome(sql, [moment, moment], django_loader=False)
        assert ours == _outcome(sql, [moment, moment], django_loader=True)
        if session_zone == "UTC":
            assert ours[1][0] == moment  # the instant itself
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('TimeZone', 'UTC', false)")


@pytest.mark.parametrize("text", ["infinity", "-infinity", "0044-03-15 12:00:00+00 BC", "12000-01-01 00:00:00+00",
                                  "9999-12-31 23:59:59.999999+00", "0001-01-01 00:00:00+00"])
def test_the_edges_read_or_fail_as_with_djangos_loader(text):
    sql = "SELECT %s::timestamptz"
    assert _outcome(sql, [text], django_loader=False) == _outcome(sql, [text], django_loader=True)
