"""Celery tasks of the waits: thin, call a service. A task is named for the pass it makes, never
the same as the service or selector it calls."""

from celery import shared_task

from jobs.periodic import PeriodicPassTask
from waits.services import waits_resume_due


@shared_task(name="waits.due", base=PeriodicPassTask, ignore_result=True)
def waits_wake_due() -> int:
    """Run by beat every WAITS_DUE_INTERVAL seconds: resume the jobs whose wait is due (a backup
    mark, a poll, the end of a Retry-After or of a transport back-off)."""
    return waits_resume_due()
