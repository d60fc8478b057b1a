"""What every process's PostgreSQL connection is opened with, read back from the server: the
URL's own options (`?sslmode=…`, `target_session_attrs=…`, here `application_name` and
`options`), in the web server's pooled connections as in every other process, and PostgreSQL's
JIT compilation off unless DATABASE_JIT asks for the server's setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.support import processes
from tests.support.processes import child_env

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT current_setting('application_name'), current_setting('jit'), "
                   "current_setting('statement_timeout')")
    print(*cursor.fetchone(), sep="|")
"""

pytestmark = pytest.mark.django_db(transaction=True)


def _probe(**env: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env=child_env(**env))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().split("|")


def _url_with_options() -> str:
    return processes.test_database_url() + "?application_name=probe-42&options=-c%20statement_timeout%3D4321"


@pytest.fixture
def postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("connection options are PostgreSQL's")


@pytest.mark.parametrize("pool", ["true", "false"])
def test_the_urls_options_reach_the_server_with_or_without_the_pool(postgresql, pool):
    # The web server's processes use the pool (taskplatform/asgi.py); its options once replaced
    # the URL's, so `?sslmode=require` or `target_session_attrs=read-write` held everywhere but there.
    name, jit, timeout = _probe(DATABASE_URL=_url_with_options(), DATABASE_POOL=pool)
    assert (name, timeout) == ("probe-42", "4321ms")
    assert jit == "off"


def test_jit_is_off_by_default_and_the_servers_own_on_request(postgresql):
    url = processes.test_database_url()
    assert _probe(DATABASE_URL=url)[1] == "off"
    with psycopg.connect(url) as plain:
        server_default = plain.execute("SELECT current_setting('jit')").fetchone()[0]
    assert _probe(DATABASE_URL=url, DATABASE_JIT="true")[1] == server_default
