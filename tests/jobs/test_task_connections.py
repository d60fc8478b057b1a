"""Around each task (taskplatform/celery.py): a connection that finished a task moments ago is not
checked again before the next (the check is a round trip to PostgreSQL per job); one idle longer
is, as Django checks a connection at the start of a request. Run in a process with a worker's
settings (a persistent, health-checked connection; the test process has the web server's pool).
In a real worker, those receivers stand in for the per-task ones of Celery's Django fix-up, and
recycle the connection every CELERY_DB_REUSE_MAX tasks as it did."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection

from jobs.models import Job
from jobs.services import job_submit
from tests.support.processes import BASE_DIR, celery_worker, child_env, wait_until

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
    signals._task_connections.ended -= signals.CONNECTION_TRUSTED_SECONDS + 1
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


@pytest.mark.worker
@pytest.mark.skipif(connection.vendor != "postgresql", reason="workers keep connections only on PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_worker_recycles_its_connection_every_reuse_max_tasks_without_the_fixups_receivers(only_own_workers):
    from taskplatform.celery import app

    app.control.purge()  # messages earlier tests left (beat's passes, their jobs) would run in between
    worker = celery_worker(name="recycling", concurrency=1, env={"CELERY_DB_REUSE_MAX": "3"}).start()
    try:
        states = []
        for _ in range(7):  # one at a time, so each runs after the last one's end
            job, _ = job_submit(kind="test.process_state", input={})
            wait_until(lambda pk=job.pk: Job.objects.filter(pk=pk, status=Job.Status.COMPLETED).exists(), timeout=30,
                       message=f"job {job.pk} did not complete")
            states.append(Job.objects.get(pk=job.pk).result)
    finally:
        worker.stop()
    assert len({state["pid"] for state in states}) == 1, "the jobs ran in more than one pool process"
    # Each job says how many tasks its connection served before it: never three (it is replaced
    # after three); a count that went up since the last job means the same connection, one that
    # did not means a new one (counted from what each job saw, should another task run between).
    served = [state["tasks_on_connection"] for state in states]
    assert max(served) <= 2, served
    kept = replaced = 0
    for before, after in zip(states, states[1:], strict=False):
        if after["tasks_on_connection"] > before["tasks_on_connection"]:
            assert after["backend_pid"] == before["backend_pid"], states
            kept += 1
        else:
            assert after["backend_pid"] != before["backend_pid"], states
            replaced += 1
    assert kept and replaced, states
    receivers = states[0]["task_prerun"] + states[0]["task_postrun"]
    assert not any(name.startswith("DjangoWorkerFixup.") for name in receivers), receivers
    assert "taskplatform.celery._connections_before_task" in states[0]["task_prerun"]
    assert "taskplatform.celery._connections_after_task" in states[0]["task_postrun"]


@pytest.mark.django_db(transaction=True)
def test_a_task_run_by_its_caller_leaves_the_callers_connection_and_transaction_alone():
    """`apply()` runs a task in the caller's thread, inside the caller's transaction here: even on
    the task that would recycle the connection, the receivers leave it be."""
    from django.conf import settings
    from django.db import transaction

    from jobs.tasks import job_run
    from taskplatform import celery as signals

    before = signals._task_connections.tasks
    signals._task_connections.tasks = settings.CELERY_DB_REUSE_MAX - 1
    try:
        with transaction.atomic():
            Job.objects.count()
            raw = connection.connection
            job_run.apply(args=["00000000-0000-0000-0000-000000000000"])  # no such job: skipped
            assert connection.connection is raw and connection.in_atomic_block
            Job.objects.count()
    finally:
        signals._task_connections.tasks = before
