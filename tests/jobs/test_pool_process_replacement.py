"""When a worker replaces its pool processes: after a job that left the process holding more than
`WORKER_MAX_MEMORY_PER_CHILD_MB` (Celery checks its peak resident set after each task), or after
`WORKER_MAX_TASKS_PER_CHILD` jobs, saying which in the worker's log; not otherwise. A replacement
costs about 0.1 s of CPU and its slot's time (bench/README.md, "A pool process's replacement"), so
the defaults replace a process for what it holds, not every few seconds. Each case runs a real
worker, and checks which process ran each job from the job's own row (`Job.worker`:
"<hostname> pid <pid>")."""

from __future__ import annotations

import pytest

from jobs.models import Job
from jobs.services import job_submit
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def _run_one_at_a_time(count: int) -> list[str]:
    """Submit `count` no-op jobs one after the other, each once the one before it finished; the
    pid that ran each."""
    pids = []
    for _ in range(count):
        job, _ = job_submit(kind="demo.noop", input={})
        wait_until(lambda job=job: Job.objects.get(pk=job.pk).is_finished, timeout=60, interval=0.05,
                   message="a job did not finish")
        job.refresh_from_db()
        assert job.status == Job.Status.COMPLETED, (job.status, job.error)
        pids.append(job.worker.rsplit(" pid ", 1)[1])
    return pids


def test_a_pool_process_over_its_memory_limit_is_replaced_after_its_job(only_own_workers):
    # 1 MB: every pool process holds more than that, so each is replaced after its first job.
    worker = celery_worker(name="memory", concurrency=1,
                           env={"WORKER_MAX_MEMORY_PER_CHILD_MB": "1", "WORKER_MAX_TASKS_PER_CHILD": "0"}).start()
    try:
        pids = _run_one_at_a_time(3)
        # Celery's pool says nothing of it; the operator is told why (ops.signals).
        wait_until(lambda: "replaced: it held" in worker.output, timeout=10, interval=0.1,
                   message="no line said the pool process was replaced for its memory")
    finally:
        worker.stop()
    assert len(set(pids)) == 3, pids  # the count limit is off: the memory limit replaced them
    replaced = [line for line in worker.lines if "replaced: it held" in line]
    assert "over WORKER_MAX_MEMORY_PER_CHILD_MB (1)" in replaced[0], replaced


def test_by_default_a_pool_process_runs_job_after_job(only_own_workers, monkeypatch):
    monkeypatch.delenv("WORKER_MAX_MEMORY_PER_CHILD_MB", raising=False)
    monkeypatch.delenv("WORKER_MAX_TASKS_PER_CHILD", raising=False)
    worker = celery_worker(name="kept", concurrency=1).start()
    try:
        pids = _run_one_at_a_time(3)
    finally:
        worker.stop()
    assert len(set(pids)) == 1, pids
    assert "pool process" not in worker.output


def test_a_pool_process_is_replaced_after_its_tasks_and_says_so(only_own_workers):
    worker = celery_worker(name="tasks", concurrency=1,
                           env={"WORKER_MAX_MEMORY_PER_CHILD_MB": "0", "WORKER_MAX_TASKS_PER_CHILD": "2"}).start()
    try:
        pids = _run_one_at_a_time(4)
        wait_until(lambda: "replaced after 2 jobs" in worker.output, timeout=10, interval=0.1,
                   message="no line said the pool process was replaced after its jobs")
    finally:
        worker.stop()
    assert pids[0] == pids[1] != pids[2] == pids[3], pids
