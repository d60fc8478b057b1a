"""A pool process killed in the middle of a job (issue 13, item 12): the worker's main process sees
its child die at once, so the job is taken back at once, not when its lease runs out. (A whole
worker host that vanishes has no one to see it: there the lease remains the way back, see
tests/chaos/test_workers.py.)"""

from __future__ import annotations

import pytest

from demo.services import step_runs
from jobs.models import Job
from jobs.services import job_submit
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_killed_pool_process_gives_its_job_back_at_once_not_after_the_lease(only_own_workers):
    # A lease far longer than the test, and no beat: only the main process can take the job back.
    worker = celery_worker(name="lossy", concurrency=1, env={"JOBS_LEASE_SECONDS": "600"}).start()
    try:
        job, _ = job_submit(kind="test.crash", input={})  # kills its own process after step `a`, 2 attempts
        done = wait_until(lambda: Job.objects.get(pk=job.pk).is_finished, timeout=60, interval=0.1,
                          message="the killed run's job was not taken back")
        assert done
        job.refresh_from_db()
        assert job.status == Job.Status.FAILED and job.error["code"] == "worker_lost", job.error
        assert job.attempts == 2 and job.lease_expires_at is None
        assert "pool process" in job.error["message"]
        assert step_runs(job_id=job.pk) == {"a": 1, "body": 2}  # the finished step did not run again
        events = list(job.events.order_by("seq").values_list("seq", flat=True))
        assert events == list(range(1, job.event_seq + 1))
    finally:
        worker.stop()
