"""Fixtures of the chaos suite: private servers to restart, and a migrated database on them.

`private_redis` and `private_postgres` are this test's own servers (see `servers.py`): restart
them at will; the machine's shared PostgreSQL and Redis are never touched. `chaos_database` is a
fresh, migrated database on the private cluster (a copy of a template migrated once a session).
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pytest

from tests.chaos.servers import JobsDatabase, PrivatePostgres, PrivateRedis, manage
from tests.support.processes import child_env

TEMPLATE = "chaos_template"


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of this test's own (`.url`, `.restart_empty()`), stopped at the end."""
    server = PrivateRedis(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def second_redis(tmp_path):
    """Another private Redis, for a process that plays an outside system."""
    server = PrivateRedis(tmp_path / "redis-2").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def private_postgres():
    """A PostgreSQL cluster of the session's own (`.url(db)`, `.restart()`), removed at the end.

    Skips, saying why, on a machine that cannot run one.
    """
    reason = PrivatePostgres.unavailable()
    if reason:
        pytest.skip(f"no private PostgreSQL cluster: {reason}")
    # Not under pytest's tmp dir: that one is private to root, and the cluster runs as `postgres`.
    server = PrivatePostgres(Path(tempfile.mkdtemp(prefix="chaos-pg-")))
    try:
        server.start()
        url = server.create_database(TEMPLATE)
        manage("migrate", "--noinput", env=child_env(DATABASE_URL=url))
    except BaseException:
        server.destroy()
        raise
    yield server
    server.destroy()


@pytest.fixture
def chaos_database(private_postgres):
    """A migrated database of this test's own on the private cluster: its URL."""
    name = f"chaos_{uuid.uuid4().hex[:10]}"
    url = private_postgres.create_database(name, template=TEMPLATE)
    yield url
    private_postgres.drop_database(name)


@pytest.fixture
def chaos_db(chaos_database) -> JobsDatabase:
    """What the test reads its assertions from (psycopg on `chaos_database`)."""
    return JobsDatabase(chaos_database)
