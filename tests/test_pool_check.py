"""The web server's pool hands out a connection without a round trip when its socket is quiet, and
replaces one that PostgreSQL closed (dbkit/pool.py). The restart of the whole server, with the web
server's requests after it, is tests/chaos/test_restarts.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.db import connection
from psycopg_pool import ConnectionPool

from dbkit import pool as pool_check

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="the pool is PostgreSQL's")


@pytest.fixture
def full_checks(monkeypatch) -> list:
    """Every full check (the empty statement's round trip), as it is made."""
    made = []
    full = ConnectionPool.check_connection

    def counted(conn):
        made.append(conn.info.backend_pid)
        return full(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return made


@pytest.fixture
def pool():
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    pool = ConnectionPool(kwargs={**params, "autocommit": True}, min_size=1, max_size=1, open=True, timeout=5,
                          check=pool_check.check_quietly)
    yield pool
    pool.close()


def _pid(pool) -> int:
    with pool.connection() as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_a_connection_back_from_a_request_goes_out_again_without_a_round_trip(pool, full_checks):
    first = _pid(pool)  # the pool's new connection: checked in full, once
    assert full_checks == [first]
    assert [_pid(pool) for _ in range(5)] == [first] * 5
    assert full_checks == [first]


@pytest.mark.django_db
def test_a_connection_that_postgresql_closed_is_replaced_before_a_request_gets_it(pool, full_checks):
    first = _pid(pool)
    with connection.cursor() as cursor:  # another session ends it, as a restart or an admin would
        cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    deadline = time.monotonic() + 5
    while not pool_check._socket_has_news(pool._pool[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    second = _pid(pool)  # no error: the dead connection was seen, checked, dropped and replaced
    assert second != first
    assert full_checks[:2] == [first, first]


def test_a_connection_quiet_for_long_gets_the_full_check(pool, full_checks, monkeypatch):
    first = _pid(pool)
    monkeypatch.setattr(pool_check, "QUIET_FOR", 0.0)
    assert _pid(pool) == first
    assert full_checks == [first, first]


PROBE = """
import django
django.setup()
from django.db import connection
from dbkit import pool
settings = connection.settings_dict
assert settings["ENGINE"] == "dbkit.postgresql" and settings["CONN_HEALTH_CHECKS"] is True, settings
assert "reset" not in settings["OPTIONS"]["pool"], settings["OPTIONS"]["pool"]
assert connection.pool._check is pool.check_quietly, connection.pool._check
# No reset callback: a returned connection goes back in the returning thread, not through the
# pool's worker thread (a queue and a thread switch per request).
assert connection.pool._reset is None
with connection.cursor() as cursor:
    cursor.execute("SELECT 1")
    assert cursor.fetchone() == (1,)
connection.close()
print("checked quietly")
"""


def test_the_web_servers_backend_gives_its_pool_this_check():
    """Django passes its own check to the pool it builds; the backend puts this one in its place.
    As the web server starts: `DATABASE_POOL=true` (taskplatform/asgi.py), a process of its own."""
    env = {**os.environ, "DATABASE_POOL": "true"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=settings.BASE_DIR, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "checked quietly" in done.stdout, done.stdout + done.stderr
