"""Runs driven by a test, in-process: claim a job, do what its handler would, record the outcome
exactly as the runner does (`jobs.runner`), so a test can interleave runs with other moves."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from jobs.models import Job
from jobs.runner import _run
from jobs.runtime import JobContext
from jobs.services import job_claim


def claim(job_id: Any, **kwargs: Any) -> JobContext:
    """Claim the job for a new run and return the run's context."""
    return JobContext(job_claim(job_id=job_id, **kwargs))


def finish(ctx: JobContext, body: Callable[[JobContext], Any]) -> str:
    """Run `body(ctx)` as the rest of the run's handler and record the outcome as the runner
    does (a suspension, a failure, a result). Returns what the runner returns."""
    def handler(ctx, input):
        return body(ctx)

    kind = SimpleNamespace(handler=handler, call=handler, time_limit=None, on_time_limit="fail")
    return _run(kind, ctx, ctx.job)


def run(job_id: Any, body: Callable[[JobContext], Any]) -> str:
    """Claim the job and run `body` as its whole handler."""
    return finish(claim(job_id), body)


def fresh(job: Job | Any) -> Job:
    return Job.objects.get(pk=getattr(job, "pk", job))
