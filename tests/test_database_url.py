"""A libpq multi-host DATABASE_URL (a primary and its standby): Django connects to whichever
host answers as read-write, in the order given (README, "Scaling out")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.chaos.servers import free_port
from tests.support import processes
from tests.support.processes import child_env

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
    print(*cursor.fetchone())
"""


@pytest.mark.django_db(transaction=True)
def test_a_multi_host_url_reaches_the_host_that_answers_read_write():
    if connection.vendor != "postgresql":
        pytest.skip("a libpq multi-host URL is PostgreSQL's")
    url = processes.test_database_url()  # postgres://user@host:port/name
    scheme, rest = url.split("://", 1)
    credentials, location = rest.split("@", 1) if "@" in rest else ("", rest)
    hostport, name = location.split("/", 1)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: a primary that is down
    multi = f"{scheme}://{credentials}@{dead},{hostport}/{name}?target_session_attrs=read-write&connect_timeout=3"
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env=child_env(DATABASE_URL=multi))
    assert result.returncode == 0, result.stderr[-2000:]
    port, in_recovery = result.stdout.split()
    assert int(port) == int(hostport.rsplit(":", 1)[1]) and in_recovery == "False"
