"""Around each task (dbkit/tasks.py, the app's task class): a connection that finished a task
moments ago is not checked again before the next (the check is a round trip to PostgreSQL per
job); one idle longer is, as Django checks a connection at the start of a request. Run in a
process with a worker's settings (a persistent, health-checked connection; the test process has
the web server's pool). In a real worker, the task class stands in for the per-task receivers of
Celery's Django fix-up, recycles the connection every CELERY_DB_REUSE_MAX tasks as it did, and no
receiver of the task signals is left (Celery's tracer then sends neither around a task)."""

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
from dbkit import tasks as signals

connection = connections["default"]
Job.objects.count()
assert connection.health_check_enabled, (connection.settings_dict, __import__("os").environ.get("DATABASE_POOL"))
with mock.patch.object(type(connection), "is_usable", autospec=True, return_value=True) as checked:
    signals.connections_after_task()
    signals.connections_before_task()
    Job.objects.count()
    back_to_back = checked.call_count
    signals.connections_after_task()
    signals.task_connections.ended -= signals.CONNECTION_TRUSTED_SECONDS + 1
    signals.connections_before_task()
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
    # after three). The same connection from one job to the next has served more tasks since; a
    # count that went down is a recycled one, a new connection. (A connection may also be
    # replaced for another reason, an error in a task of another test left in the queue: then the
    # count goes on, on a new backend.)
    served = [state["tasks_on_connection"] for state in states]
    assert max(served) <= 2, served
    kept = recycled = 0
    for before, after in zip(states, states[1:], strict=False):
        if after["backend_pid"] == before["backend_pid"]:
            assert after["tasks_on_connection"] > before["tasks_on_connection"], states
            kept += 1
        elif after["tasks_on_connection"] <= before["tasks_on_connection"]:
            recycled += 1
    assert kept and recycled, [(state["tasks_on_connection"], state["backend_pid"]) for state in states]
    # Neither the fix-up's receivers nor any other: Celery's tracer sends no task signal.
    assert states[0]["task_prerun"] == states[0]["task_postrun"] == [], states[0]


@pytest.mark.django_db(transaction=True)
def test_a_task_run_by_its_caller_leaves_the_callers_connection_and_transaction_alone():
    """`apply()` runs a task in the caller's thread, inside the caller's transaction here: even on
    the task that would recycle the connection, the receivers leave it be."""
    from django.conf import settings
    from django.db import transaction

    from dbkit import tasks as signals
    from jobs.tasks import job_run

    before = signals.task_connections.tasks
    signals.task_connections.tasks = settings.CELERY_DB_REUSE_MAX - 1
    try:
        with transaction.atomic():
            Job.objects.count()
            raw = connection.connection
            job_run.apply(args=["00000000-0000-0000-0000-000000000000"])  # no such job: skipped
            assert connection.connection is raw and connection.in_atomic_block
            Job.objects.count()
    finally:
        signals.task_connections.tasks = before
