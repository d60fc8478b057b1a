"""Around each task (taskplatform/celery.py): a connection that finished a task moments ago is not
checked again before the next (the check is a round trip to PostgreSQL per job); one idle longer
is, as Django checks a connection at the start of a request. Run in a process with a worker's
settings (a persistent, health-checked connection; the test process has the web server's pool)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection

from tests.support.processes import BASE_DIR, child_env

SCRIPT = """
import django
django.setup()
from unittest import mock
from django.db import connections
from jobs.models import Job
from taskplatform import celery as signals

connection = connections["default"]
Job.objects.count()
assert connection.health_check_enabled, (connection.settings_dict, __import__("os").environ.get("DATABASE_POOL"))
with mock.patch.object(type(connection), "is_usable", autospec=True, return_value=True) as checked:
    signals._connections_after_task()
    signals._connections_before_task()
    Job.objects.count()
    back_to_back = checked.call_count
    signals._connections_after_task()
    signals._connections_last_used[0] -= signals.CONNECTION_TRUSTED_SECONDS + 1
    signals._connections_before_task()
    Job.objects.count()
    print("checks", back_to_back, checked.call_count - back_to_back)
"""


@pytest.mark.skipif(connection.vendor != "postgresql", reason="workers keep connections only on PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_connection_used_by_the_task_before_is_trusted_and_an_idle_one_is_checked():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=BASE_DIR, env=child_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["checks", "0", "1"]
