"""Reads: which jobs and events a caller may see. Every page, API view and websocket consumer
asks these, so the visibility rule lives in one place (the contract's "Visibility")."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from dbkit.kept import KeptRead
from jobs.errors import JobNotFound
from jobs.extensions import visibility_rules
from jobs.models import Job, JobEvent


def jobs_visible_to(user: Any, *, per_row: bool = False) -> QuerySet[Job]:
    """Jobs `user` may see: those they created, all for staff, and those the feature apps'
    visibility rules add (`jobs.extensions.visibility_rule`: a reviewer sees the jobs with a
    question they may answer).

    `per_row`: for a read of one job or a few, each rule checks that job's own rows, the same few
    index reads at any size; without it (a list, a count) the planner may build a rule's sets
    once for all the rows it checks (`accounts.assignment`)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Job.objects.none()
    if user.is_staff:
        return Job.objects.all()
    condition = Q(owner=user)
    for rule in visibility_rules():
        condition |= rule(user, per_row=per_row)
    return Job.objects.filter(condition)


def job_visible_to_which(*, job_id: Any, users: list[Any]) -> set[Any]:
    """The pks of those of `users` who may see the job `job_id`: the rule of `jobs_visible_to`,
    for many users in one statement per 50 (an EXISTS per user), not one query per user."""
    seeing: set[Any] = set()
    for start in range(0, len(users), 50):
        part = users[start:start + 50]
        checks = {f"u{index}": Exists(jobs_visible_to(user, per_row=True).filter(pk=OuterRef("pk")))
                  for index, user in enumerate(part)}
        row = Job.objects.filter(pk=job_id).annotate(**checks).values(*checks).first()
        if row is None:
            return set()
        seeing.update(user.pk for index, user in enumerate(part) if row[f"u{index}"])
    return seeing


def job_get_visible(*, user: Any, job_id: Any) -> Job:
    """The job `job_id` if `user` may see it; JobNotFound otherwise (as if it did not exist)."""
    try:
        job = _job_visible(user, job_id)
    except (ValueError, TypeError, ValidationError):  # not a UUID
        job = None
    if job is None:
        raise JobNotFound(f"job {job_id} does not exist")
    return job


# The reads of one job that need none of the feature apps' rules, built once per connection
# (dbkit.kept): any job, for staff; the user's own job, for anyone else. The second is an API
# client reading the job it submitted, the read it polls with: the rules' statement took 1.3 ms
# of CPU to build for it (6 ms for a reviewer), its whole GET about 3.3 ms.
_ANY_JOB = KeptRead(lambda job_id: Job.objects.filter(pk=job_id).order_by(), stand_ins=(uuid.UUID(int=0),))
_OWN_JOB = KeptRead(lambda job_id, owner_id: Job.objects.filter(pk=job_id, owner_id=owner_id).order_by(),
                    stand_ins=(uuid.UUID(int=0), -1))


def _job_visible(user: Any, job_id: Any) -> Job | None:
    """`jobs_visible_to(user).filter(pk=job_id).first()`, the cheap cases first."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    using = Job.objects.db
    found = _ANY_JOB.rows(job_id, using=using) if user.is_staff else _OWN_JOB.rows(job_id, user.pk, using=using)
    if found or user.is_staff:
        return found[0] if found else None
    return jobs_visible_to(user, per_row=True).filter(pk=job_id).first()


def job_events_after(*, job_id: Any, after: int = 0, limit: int = 1000) -> list[JobEvent]:
    """The job's events with seq > `after`, oldest first, at most `limit`."""
    return list(JobEvent.objects.filter(job_id=job_id, seq__gt=after).order_by("seq")[:limit])


def job_may_manage(*, user: Any, job: Job) -> bool:
    """May `user` cancel or retry `job`? Its creator and staff may; a reviewer who sees it only
    through a question may not."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return bool(user.is_staff or (job.owner_id is not None and job.owner_id == user.pk))


def job_children_counts(job: Job) -> dict[str, int]:
    """How many of the jobs `job` spawned are in each status (`{}` for none)."""
    rows = Job.objects.filter(parent_id=job.pk).order_by().values_list("status").annotate(n=Count("id"))
    order = {status: index for index, status in enumerate(Job.Status.values)}
    return {status: n for status, n in sorted(rows, key=lambda row: order.get(row[0], 99))}
