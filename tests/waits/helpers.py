"""Small helpers for the waits tests."""

from __future__ import annotations

from typing import Any

from jobs.models import Job
from jobs.services import job_submit
from tests.support.processes import wait_until
from waits.models import Wait


def submit(kind: str, **input: Any) -> Job:
    job, _ = job_submit(kind=kind, input=input)
    return job


def finished(job: Job, timeout: float = 30.0) -> Job:
    """The job once it is completed, failed or cancelled."""
    def done() -> Job | None:
        fresh = Job.objects.get(pk=job.pk)
        return fresh if fresh.is_finished else None

    return wait_until(done, timeout=timeout, interval=0.05, message=f"job {job.pk} did not finish")


def parked(job: Job, timeout: float = 30.0) -> Wait:
    """The job's wait once the service accepted the work and the job is parked."""
    def waiting() -> Wait | None:
        wait = Wait.objects.filter(job=job, state=Wait.State.WAITING, job__status=Job.Status.WAITING).first()
        return wait
    return wait_until(waiting, timeout=timeout, interval=0.05, message=f"job {job.pk} did not park")


def the_wait(job: Job) -> Wait:
    return Wait.objects.get(job=job)


def wait_events(job: Job) -> list[tuple[str, dict]]:
    return [(e.status, e.message) for e in job.events.filter(type="wait").order_by("seq")]
