"""Reads of waits: the due ones, and who may see or act on which."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, F, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Concat

from accounts.assignment import assigned_to_user
from approvals.selectors import ANSWER_PERMISSION, kinds_allowing_self_approval
from jobs.clock import db_now
from jobs.models import Job
from jobs.selectors import jobs_visible_to
from waits.errors import WaitNotFound
from waits.models import Wait


def waits_due(*, limit: int = 500) -> list[tuple[int, Any, str]]:
    """(wait id, job id, key) of active waits whose next look is due and whose job is parked on
    that wait (a wait its job no longer parks on is never due). Due by the database's clock, the
    one the due times are written with (`jobs.clock`)."""
    return list(
        Wait.objects.filter(
            state__in=Wait.ACTIVE, next_due_at__lte=db_now(), job__status=Job.Status.WAITING,
            job__suspended_on=Concat(Value("wait:"), F("key")),
        )
        .order_by("next_due_at")
        .values_list("pk", "job_id", "key")[:limit]
    )


def waits_actable_by(user: Any, *, per_row: bool = False) -> QuerySet[Wait]:
    """Combined waits `user` may act on (whatever their state): the rule of
    `waits.people.wait_check_can_act`, as a query (as `approvals.selectors.questions_answerable_by`
    is for questions, `per_row` as there)."""
    if user is None or not user.is_authenticated or not user.is_active or not user.has_perm(ANSWER_PERMISSION):
        return Wait.objects.none()
    waits = Wait.objects.filter(person__isnull=False)
    if not user.is_superuser:
        waits = waits.filter(assigned_to_user(users=Wait.assigned_users.through, groups=Wait.assigned_groups.through,
                                              row_field="wait_id", user=user, per_row=per_row))
    return waits.filter(
        Q(job__owner__isnull=True) | ~Q(job__owner=user) | Q(job__kind__in=kinds_allowing_self_approval())
    )


def waits_visible_to(user: Any, *, per_row: bool = False) -> QuerySet[Wait]:
    """Waits `user` may see: those of the jobs they may see (`jobs.selectors.jobs_visible_to`,
    which counts the combined waits they may act on; `per_row` as there)."""
    # Each wait's job, not `job IN (every job they may see)`: a set PostgreSQL builds whole, even
    # for a read of one wait.
    return Wait.objects.filter(Exists(jobs_visible_to(user, per_row=per_row).filter(pk=OuterRef("job_id"))))


def wait_get_visible(*, user: Any, wait_id: Any) -> Wait:
    """The wait `wait_id` if `user` may see it; WaitNotFound otherwise (as if it did not exist)."""
    try:
        pk = int(wait_id)
    except (ValueError, TypeError):
        pk = 0
    wait = waits_visible_to(user, per_row=True).select_related("job").filter(pk=pk).first() if 0 < pk < 2**63 else None
    if wait is None:
        raise WaitNotFound(f"wait {wait_id} does not exist")
    return wait
