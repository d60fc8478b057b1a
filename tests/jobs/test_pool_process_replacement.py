"""When a worker replaces its pool processes: after a job that left the process holding more than
`WORKER_MAX_MEMORY_PER_CHILD_MB` (Celery checks its peak resident set after each task), or after
`WORKER_MAX_TASKS_PER_CHILD` jobs, saying which in the worker's log; not otherwise. A replacement
costs about 0.1 s of CPU and its slot's time (bench/README.md, "A pool process's replacement"), so
the defaults replace a process for what it holds, not every few seconds. Each case runs a real
worker, and checks which process ran each job from the job's own row (`Job.worker`:
"<hostname> pid <pid>")."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from jobs.models import Job
from jobs.registry import _kinds, kind_get
from jobs.services import job_submit
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def on_a_queue_of_its_own(monkeypatch):
    """The test's jobs go to a queue that only its worker reads. Messages earlier tests left in the
    shared queues (their jobs, beat's passes, unacknowledged ones the broker gives back when a
    worker starts) would each count as a pool process's task in between: four jobs then ran in
    four processes where two should take two each."""
    queue = f"replacement-{uuid.uuid4().hex[:8]}"
    monkeypatch.setitem(_kinds, "demo.noop", dataclasses.replace(kind_get("demo.noop"), queue=queue))
    return queue


def _jobs_on_a_worker(queue: str, count: int, env: dict[str, str] | None = None,
                      says: str | None = None, extra_args: list[str] | None = None) -> tuple[list[str], str]:
    """Start a worker with one pool process and `env`, reading `queue` alone, run `count` no-op
    jobs through it one after the other (each once the one before it finished), wait for its log
    to say `says`; the pid that ran each job, and the worker's output."""
    worker = celery_worker(name="replacement", concurrency=1, queues=queue, env=env, extra_args=extra_args).start()
    pids = []
    try:
        for _ in range(count):
            job, _ = job_submit(kind="demo.noop", input={})
            wait_until(lambda job=job: Job.objects.get(pk=job.pk).is_finished, timeout=60, interval=0.05,
                       message="a job did not finish")
            job.refresh_from_db()
            assert job.status == Job.Status.COMPLETED, (job.status, job.error)
            pids.append(job.worker.rsplit(" pid ", 1)[1])
        if says:
            wait_until(lambda: says in worker.output, timeout=10, interval=0.1,
                       message=f"the worker's log did not say {says!r}")
    finally:
        worker.stop()
    return pids, worker.output


def test_a_pool_process_over_its_memory_limit_is_replaced_after_its_job(only_own_workers, on_a_queue_of_its_own):
    # 1 MB: every pool process holds more than that, so each is replaced after its first job.
    # Celery's pool says nothing of it; the operator is told why (ops.signals).
    pids, output = _jobs_on_a_worker(on_a_queue_of_its_own, 3,
                                     {"WORKER_MAX_MEMORY_PER_CHILD_MB": "1", "WORKER_MAX_TASKS_PER_CHILD": "0"},
                                     says="replaced: it held")
    assert len(set(pids)) == 3, pids  # the count limit is off: the memory limit replaced them
    replaced = [line for line in output.splitlines() if "replaced: it held" in line]
    assert "over WORKER_MAX_MEMORY_PER_CHILD_MB (1)" in replaced[0], replaced


def test_by_default_a_pool_process_runs_job_after_job(only_own_workers, on_a_queue_of_its_own, monkeypatch):
    monkeypatch.delenv("WORKER_MAX_MEMORY_PER_CHILD_MB", raising=False)
    monkeypatch.delenv("WORKER_MAX_TASKS_PER_CHILD", raising=False)
    pids, output = _jobs_on_a_worker(on_a_queue_of_its_own, 3)
    assert len(set(pids)) == 1, pids
    assert "pool process" not in output


def test_a_pool_process_is_replaced_after_its_tasks_and_says_so(only_own_workers, on_a_queue_of_its_own):
    pids, _ = _jobs_on_a_worker(on_a_queue_of_its_own, 4,
                                {"WORKER_MAX_MEMORY_PER_CHILD_MB": "0", "WORKER_MAX_TASKS_PER_CHILD": "2"},
                                says="replaced after 2 jobs")
    assert pids[0] == pids[1] != pids[2] == pids[3], pids


def test_a_limit_on_the_workers_command_line_is_the_one_it_says(only_own_workers, on_a_queue_of_its_own):
    pids, _ = _jobs_on_a_worker(on_a_queue_of_its_own, 3, {"WORKER_MAX_MEMORY_PER_CHILD_MB": "0"},
                                says="replaced after 3 jobs", extra_args=["--max-tasks-per-child", "3"])
    assert len(set(pids)) == 1, pids


def test_a_pool_process_that_left_is_replaced_at_once(only_own_workers, on_a_queue_of_its_own):
    """Celery's pool looked for the exit of a process that left a moment before the process could
    be reaped, now and then, and then replaced it only at its periodic look, 5 s later, with no
    process to take the next job meanwhile (taskplatform/prefork.py). A new process for each of
    16 jobs: from each job's `pending` row to its `processing` row, never near those 5 s."""
    pids, _ = _jobs_on_a_worker(on_a_queue_of_its_own, 16,
                                {"WORKER_MAX_MEMORY_PER_CHILD_MB": "0", "WORKER_MAX_TASKS_PER_CHILD": "1"})
    assert len(set(pids)) == 16, pids
    waits = []
    for job in Job.objects.all():
        times = {event.status: event.created_at for event in job.events.filter(type="status")}
        waits.append(round((times[Job.Status.PROCESSING] - times[Job.Status.PENDING]).total_seconds(), 3))
    assert len(waits) == 16
    assert max(waits) < 2.5, f"a job waited for a pool process: seconds from pending to processing {sorted(waits)}"


def test_the_worker_pool_is_the_platforms_prefork_pool():
    """What Celery and its Django fix-up take for a prefork pool (by class and by module name)."""
    from celery.concurrency import get_implementation, prefork

    from taskplatform.celery import app

    pool = get_implementation(app.conf.worker_pool)
    assert issubclass(pool, prefork.TaskPool)
    assert "prefork" in pool.__module__
