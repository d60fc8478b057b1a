"""Celery tasks: thin, take an id, call a service."""

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.conf import settings

from jobs.broadcast import flush_pending
from jobs.runner import job_execute
from jobs.services import jobs_redispatch_stale


@shared_task(name="jobs.run", ignore_result=True)
def job_run(job_id: str) -> str:
    """Run the job `job_id` once (claim, handler, outcome). Safe to deliver twice."""
    return job_execute(job_id=job_id)


@shared_task(name="jobs.reconcile", ignore_result=True)
def jobs_reconcile() -> int:
    """Run by beat: re-send the messages of pending jobs that never reached a worker."""
    return jobs_redispatch_stale(grace=settings.JOBS_DISPATCH_GRACE)


@worker_process_shutdown.connect
def _push_the_last_events(**kwargs) -> None:
    """A pool process being retired (max tasks per child, shutdown) first sends what it wrote."""
    flush_pending(timeout=2.0)
