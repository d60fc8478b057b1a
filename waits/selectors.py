"""Reads of waits: the due ones."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Concat
from django.utils import timezone

from jobs.models import Job
from waits.models import Wait


def waits_due(*, limit: int = 500) -> list[tuple[int, Any, str]]:
    """(wait id, job id, key) of active waits whose next look is due and whose job is parked on
    that wait (a wait its job no longer parks on is never due)."""
    return list(
        Wait.objects.filter(
            state__in=Wait.ACTIVE, next_due_at__lte=timezone.now(), job__status=Job.Status.WAITING,
            job__suspended_on=Concat(Value("wait:"), F("key")),
        )
        .order_by("next_due_at")
        .values_list("pk", "job_id", "key")[:limit]
    )
