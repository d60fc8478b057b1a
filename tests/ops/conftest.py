"""Fixtures of the ops tests."""

from __future__ import annotations

import pytest
from django.conf import settings

from ops.models import PeriodicPass
from ops.scheduler import scheduler_lease_claim


@pytest.fixture
def scheduler_beating(db):
    """A scheduler that has just renewed its lease, and every pass just run: what /readyz needs
    besides the database, Redis and a worker."""
    scheduler_lease_claim(holder="test-beat", lease=settings.SCHEDULER_LEASE_SECONDS)
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        PeriodicPass.objects.update_or_create(name=entry["task"], defaults={"runs": 1})
    from django.db.models.functions import Now

    PeriodicPass.objects.update(last_finished_at=Now(), last_succeeded_at=Now())
