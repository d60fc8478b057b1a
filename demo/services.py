from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from demo.models import StepRun


def step_run_count(*, job_id: Any, step: str) -> None:
    """Count one real run of `step` of job `job_id` (committed at once, whatever the job does)."""
    if StepRun.objects.filter(job_id=job_id, step=step).update(runs=F("runs") + 1):
        return
    try:
        with transaction.atomic():
            StepRun.objects.create(job_id=job_id, step=step, runs=1)
    except IntegrityError:
        StepRun.objects.filter(job_id=job_id, step=step).update(runs=F("runs") + 1)


def step_runs(*, job_id: Any) -> dict[str, int]:
    return dict(StepRun.objects.filter(job_id=job_id).values_list("step", "runs"))
