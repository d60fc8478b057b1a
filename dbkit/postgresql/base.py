"""Django's PostgreSQL backend, whose connection pool checks a connection with `dbkit.pool`.

Django builds the pool itself and passes psycopg's `check_connection` (a round trip each time a
request takes a connection) when `CONN_HEALTH_CHECKS` is on, or no check at all; its pool options
cannot name another. This backend lets Django build the pool as always, health checks on, and then
gives it `dbkit.pool.check_quietly` in that check's place.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

from dbkit.pool import check_quietly


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        # psycopg_pool keeps its check as `_check` (tests/test_pool_check.py checks that it still does).
        if pool is not None and pool._check is ConnectionPool.check_connection:
            pool._check = check_quietly
        return pool
