"""One run of a job, from claim to outcome. Called by the Celery task with a job id."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from jobs.errors import InvalidTransition, JobNotFound, UnknownKind
from jobs.events import RunLost
from jobs.registry import kind_get
from jobs.runtime import JobContext, JobFailure, ParkForWait, PauseForResolution
from jobs.services import job_claim, job_complete, job_fail, job_park, job_pause

logger = logging.getLogger(__name__)


def job_execute(*, job_id: Any) -> str:
    """Claim the job and run its handler once; record the outcome. Returns what happened.

    A second delivery of the same message finds the job claimed and does nothing. The outcome
    is written only if this run still owns the job: a job cancelled meanwhile stays cancelled.
    """
    try:
        job = job_claim(job_id=job_id)
    except (InvalidTransition, JobNotFound) as exc:
        logger.info("job %s not claimed: %s", job_id, exc)
        return "skipped"

    try:
        kind = kind_get(job.kind)
    except UnknownKind as exc:
        return _record(job_fail, job=job, code=UnknownKind.code, message=exc.message, retry=False)

    ctx = JobContext(job)
    try:
        try:
            result = kind.handler(ctx, job.input)
        finally:
            # A progress report held back by coalescing is written before the outcome, so the
            # log ends with the job's last reported state (a lost run raises RunLost here).
            ctx.flush()
    except PauseForResolution as pause:
        return _record(job_pause, job=job, question=pause.question)
    except ParkForWait as park:
        return _record(job_park, job=job, apply=park.apply, message=park.message)
    except RunLost as exc:
        logger.info("job %s: run stopped: %s", job_id, exc)
        return "lost"
    except JobFailure as exc:
        return _record(job_fail, job=job, code=exc.code, message=exc.message, retry=False, record=exc.record)
    except SoftTimeLimitExceeded:
        return _record(job_fail, job=job, code="timeout", message="the job ran past its time limit", retry=False)
    except Exception as exc:
        logger.exception("job %s (%s) raised", job_id, job.kind)
        message = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc(limit=-8))
        return _record(job_fail, job=job, code="exception", message=message)
    return _record(job_complete, job=job, result=result)


def _record(service, **kwargs: Any) -> str:
    try:
        job = service(**kwargs)
    except (InvalidTransition, RunLost) as exc:
        # The job moved on without this run (cancelled while it ran): keep what happened.
        logger.info("outcome of job %s dropped: %s", kwargs["job"].pk, exc)
        return "lost"
    return job.status
