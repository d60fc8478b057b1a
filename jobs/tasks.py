"""Celery tasks: thin, take an id, call a service."""

from celery import shared_task

from jobs.runner import job_execute


@shared_task(name="jobs.run", ignore_result=True)
def job_run(job_id: str) -> str:
    """Run the job `job_id` once (claim, handler, outcome). Safe to deliver twice."""
    return job_execute(job_id=job_id)
