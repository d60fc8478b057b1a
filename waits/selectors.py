"""Reads of waits: by token hash, a job's waits, the due ones."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from jobs.models import Job
from waits.models import Wait


def waits_of_job(*, job_id: Any) -> QuerySet[Wait]:
    """The job's waits, newest first."""
    return Wait.objects.filter(job_id=job_id).order_by("-created_at")


def waits_due(*, limit: int = 500) -> list[tuple[int, Any, str]]:
    """(wait id, job id, key) of active waits whose next look is due and whose job is parked."""
    return list(
        Wait.objects.filter(
            state__in=Wait.ACTIVE, next_due_at__lte=timezone.now(), job__status=Job.Status.WAITING
        )
        .order_by("next_due_at")
        .values_list("pk", "job_id", "key")[:limit]
    )
