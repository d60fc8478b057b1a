"""A new pool process connects to PostgreSQL and to Redis (its push thread) before its first job,
not in that job's time: without it the first event of every new pool process reached its
watchers some 20 ms later than the rest (bench/README.md). Celery's Django fix-up closes the
connections a pool process inherits from its own `worker_process_init` receiver, so ours must run
after it: this checks the order as a real worker has it, at its start and when a pool process is
replaced after its `--max-tasks-per-child`. Then it rehearses a run's moves (`jobs.runner.moves_rehearse`)
before its first job."""

from __future__ import annotations

from urllib.parse import urlsplit

import psutil
import pytest
from django.conf import settings
from django.db import connection

from jobs.models import Job
from jobs.services import job_submit
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def _ports() -> tuple[int, int]:
    database = int(connection.settings_dict.get("PORT") or 5432)
    redis = urlsplit(settings.REDIS_URL).port or 6379
    return database, redis


def _pool_processes(worker) -> list[psutil.Process]:
    return psutil.Process(worker.proc.pid).children(recursive=True)


def _connected(process: psutil.Process, port: int) -> bool:
    return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
               for c in process.net_connections(kind="tcp"))


def _all_connected(worker, ports: tuple[int, ...]) -> list[int] | None:
    processes = _pool_processes(worker)
    if not processes:
        return None
    try:
        if all(_connected(process, port) for process in processes for port in ports):
            return [process.pid for process in processes]
    except psutil.NoSuchProcess:  # replaced meanwhile: look again
        return None
    return None


def test_each_new_pool_process_connects_before_its_first_job(only_own_workers):
    if connection.vendor != "postgresql":
        pytest.skip("the database connection is a TCP connection on PostgreSQL only")
    ports = _ports()
    worker = celery_worker(name="ahead", concurrency=1, extra_args=["--max-tasks-per-child", "1"]).start()
    try:
        first = wait_until(lambda: _all_connected(worker, ports), timeout=30, interval=0.2,
                           message="the pool process did not connect to PostgreSQL and Redis before any job")
        # One job retires that pool process; its replacement connects before the next job too.
        job, _ = job_submit(kind="demo.noop", input={})
        wait_until(lambda: Job.objects.get(pk=job.pk).is_finished, timeout=60, interval=0.1,
                   message="the job did not finish")
        second = wait_until(lambda: (pids := _all_connected(worker, ports)) and pids != first and pids,
                            timeout=30, interval=0.2,
                            message="the replacing pool process did not connect ahead of its first job")
        assert second != first
    finally:
        worker.stop()


def _backend_query(process: psutil.Process, port: int) -> str | None:
    """The last statement of `process`'s PostgreSQL backend (`pg_stat_activity`, by its client port)."""
    local = [c.laddr.port for c in process.net_connections(kind="tcp") if c.raddr and c.raddr.port == port]
    if not local:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE client_port = %s", [local[0]])
        row = cursor.fetchone()
    return row[0] if row else None


def test_a_new_pool_process_rehearses_its_moves_before_its_first_job(only_own_workers):
    """`jobs.runner.moves_rehearse` runs in a real worker's new pool process, after its connection
    and before any job: its backend's last statement is the rehearsal's COMMIT."""
    if connection.vendor != "postgresql":
        pytest.skip("the rehearsal is PostgreSQL's")
    ports = _ports()
    worker = celery_worker(name="rehearsal", concurrency=1).start()
    try:
        wait_until(lambda: _all_connected(worker, ports), timeout=30, interval=0.2,
                   message="the pool process did not connect to PostgreSQL and Redis")
        (process,) = _pool_processes(worker)
        # Connected is not yet rehearsed: the backend's statements are looked at until the
        # rehearsal's COMMIT is its last (a statement of the rehearsal may be the one seen first).
        seen: list[str | None] = []

        def rehearsed() -> bool:
            seen.append(_backend_query(process, ports[0]))
            return seen[-1] == "COMMIT"

        try:
            wait_until(rehearsed, timeout=10, interval=0.05)
        except AssertionError:
            raise AssertionError(f"the pool process's backend never ended on the rehearsal's COMMIT; "
                                 f"its last statement: {seen[-1]!r}") from None
    finally:
        worker.stop()
