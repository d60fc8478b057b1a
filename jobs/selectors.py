"""Reads: which jobs and events a caller may see. Every page, API view and websocket consumer
asks these, so the visibility rule lives in one place (the contract's "Visibility")."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef, Q, QuerySet

from jobs.errors import JobNotFound
from jobs.models import Job, JobEvent


def jobs_visible_to(user: Any) -> QuerySet[Job]:
    """Jobs `user` may see: those they created, all for staff, and those with a question they
    may answer."""
    from approvals.selectors import questions_answerable_by

    if user is None or not user.is_authenticated or not user.is_active:
        return Job.objects.none()
    if user.is_staff:
        return Job.objects.all()
    answerable = questions_answerable_by(user).filter(job_id=OuterRef("pk"))
    return Job.objects.filter(Q(owner=user) | Exists(answerable))


def job_visible_to_which(*, job_id: Any, users: list[Any]) -> set[Any]:
    """The pks of those of `users` who may see the job `job_id`: the rule of `jobs_visible_to`,
    for many users in one statement per 50 (an EXISTS per user), not one query per user."""
    seeing: set[Any] = set()
    for start in range(0, len(users), 50):
        part = users[start:start + 50]
        checks = {f"u{index}": Exists(jobs_visible_to(user).filter(pk=OuterRef("pk")))
                  for index, user in enumerate(part)}
        row = Job.objects.filter(pk=job_id).annotate(**checks).values(*checks).first()
        if row is None:
            return set()
        seeing.update(user.pk for index, user in enumerate(part) if row[f"u{index}"])
    return seeing


def job_get_visible(*, user: Any, job_id: Any) -> Job:
    """The job `job_id` if `user` may see it; JobNotFound otherwise (as if it did not exist)."""
    try:
        job = jobs_visible_to(user).filter(pk=job_id).first()
    except (ValueError, TypeError, ValidationError):  # not a UUID
        job = None
    if job is None:
        raise JobNotFound(f"job {job_id} does not exist")
    return job


def job_events_after(*, job_id: Any, after: int = 0, limit: int = 1000) -> list[JobEvent]:
    """The job's events with seq > `after`, oldest first, at most `limit`."""
    return list(JobEvent.objects.filter(job_id=job_id, seq__gt=after).order_by("seq")[:limit])


def job_may_manage(*, user: Any, job: Job) -> bool:
    """May `user` cancel or retry `job`? Its creator and staff may; a reviewer who sees it only
    through a question may not."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return bool(user.is_staff or (job.owner_id is not None and job.owner_id == user.pk))
