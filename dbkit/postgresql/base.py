"""Django's PostgreSQL backend with two changes, both invisible to the code above it.

**The pool's check.** Django builds the pool itself and passes psycopg's `check_connection` (a
round trip each time a request takes a connection) when `CONN_HEALTH_CHECKS` is on, or no check
at all; its pool options cannot name another. This backend lets Django build the pool as always,
health checks on, and then gives it `dbkit.pool.check_quietly` in that check's place.

**Timestamps read in C.** With psycopg 3, Django reads every `timestamptz` through its own
loader (`psycopg_any.BaseTzLoader`), a subclass of psycopg's pure-Python one: about 5 µs per
value, where the C parser of `datetime.fromisoformat` takes 0.2. A job's moves return its row with
nine timestamps, so on a pool process running no-op jobs this parsing was 7.5 % of the samples
inside `job_execute` (py-spy, `bench/README.md`). `FastTzLoader` parses with `fromisoformat`
when the result is exactly what Django's loader gives: the connection's time zone is UTC (Django's
default with `USE_TZ`, which sets the session's time zone to it) and PostgreSQL wrote an offset
of zero. Anything else (another time zone, `infinity`, a date BC, a year past 9999) goes to
Django's loader as before, so the values, their errors and their `tzinfo` are the same
(`tests/test_timestamp_loader.py` compares the two on values PostgreSQL writes).
"""

from __future__ import annotations

import datetime
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

from dbkit.conf import setting
from dbkit.pool import check_quietly

try:
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader, get_adapters_template, is_psycopg3
except ImportError:  # psycopg 2: Django's own path
    is_psycopg3 = False

_UTC = datetime.UTC
_parse = datetime.datetime.fromisoformat

if is_psycopg3:
    from psycopg import adapt

    class FastTzLoader(BaseTzLoader):
        """Django's `timestamptz` loader for a connection in UTC, parsing in C when PostgreSQL
        wrote an offset of zero."""

        timezone = _UTC

        def load(self, data: Any) -> datetime.datetime:
            try:
                value = _parse(str(data, "ascii"))
            except ValueError:  # infinity, BC, beyond year 9999: Django's loader says what it is
                return super().load(data)
            if value.tzinfo is _UTC:  # an offset of zero: fromisoformat gives the UTC singleton
                return value
            return super().load(data)

    @lru_cache
    def adapters_template(use_tz: bool, timezone: Any) -> Any:
        """Django's adapters for a connection (`get_adapters_template`); in UTC, with
        `FastTzLoader` reading `timestamptz` (its `timezone` is the connection's, so Django's
        cursors see the loader they expect and do not register another)."""
        context = get_adapters_template(use_tz, timezone)
        if timezone is not _UTC:
            return context
        context = adapt.AdaptersMap(context)
        context.register_loader("timestamptz", FastTzLoader)
        return context


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def queries_logged(self) -> bool:
        """Django records every statement's SQL (`connection.queries`) under DEBUG, built with its
        values written in: 5 % of the web process's CPU per `POST /api/jobs/` under `make run`,
        whose web process has DEBUG. Here DEBUG records them only with DATABASE_RECORD_QUERIES;
        a test that captures them (`CaptureQueriesContext`, `assertNumQueries`) always does."""
        return self.force_debug_cursor or (setting("DEBUG") and setting("DATABASE_RECORD_QUERIES", True))

    @property
    def pool(self) -> Any:
        pool = super().pool
        # psycopg_pool keeps its check as `_check` (tests/test_pool_check.py checks that it still does).
        if pool is not None and pool._check is ConnectionPool.check_connection:
            pool._check = check_quietly
        return pool

    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        if is_psycopg3 and "context" in params:
            params["context"] = adapters_template(settings.USE_TZ, self.timezone)
        return params
