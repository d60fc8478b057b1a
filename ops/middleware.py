"""The web server's side of job log context: a request about one job logs with its id and kind.

`JobLogContextMiddleware` recognises a job's id in the path (its page `/jobs/{id}/...`, its API
`/api/jobs/{id}/...`, its admin page `/admin/jobs/job/{id}/...`), looks up the kind (one
primary-key query of one column, remembered: a job's kind never changes, and clients poll the same
job again and again), and makes them the log context of the request
(`ops.logging`). The context is cleared when the response is closed
(`request_finished`), not when the middleware returns: Django logs a 4xx or 5xx response
("Conflict: /api/jobs/.../cancel/") after the middleware chain, and that line is about the job
too. Works for sync and async views alike (the event stream is async).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from jobs.models import Job
from ops.logging import job_log_context_reset, job_log_context_set

JOB_PATH = re.compile(r"^/(?:api/jobs|jobs|admin/jobs/job)/(?P<job_id>[0-9a-fA-F-]{32,36})(?:/|$)")
# Kinds of the jobs seen lately, per process; emptied when full (a bound, not an LRU: cheap).
KINDS_REMEMBERED = 10_000
_kinds: dict[uuid.UUID, str] = {}


def job_id_in_path(path: str) -> uuid.UUID | None:
    """The job id a request path is about, or None."""
    match = JOB_PATH.match(path)
    if match is None:
        return None
    try:
        return uuid.UUID(match["job_id"])
    except ValueError:
        return None


def _kind_of(job_id: uuid.UUID) -> str | None:
    if job_id not in _kinds:
        _remember(job_id, Job.objects.filter(pk=job_id).values_list("kind", flat=True).first())
    return _kinds.get(job_id)


async def _akind_of(job_id: uuid.UUID) -> str | None:
    if job_id not in _kinds:
        _remember(job_id, await Job.objects.filter(pk=job_id).values_list("kind", flat=True).afirst())
    return _kinds.get(job_id)


def _remember(job_id: uuid.UUID, kind: str | None) -> None:
    if kind is None:  # an unknown id may be a job created later
        return
    if len(_kinds) >= KINDS_REMEMBERED:
        _kinds.clear()
    _kinds[job_id] = kind


class JobLogContextMiddleware:
    """Makes the job a request is about the log context of that request (sync or async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if self.is_async:
            return self._acall(request)
        job_id = job_id_in_path(request.path_info)
        if job_id is not None:
            job_log_context_set(job_id=job_id, job_kind=_kind_of(job_id))
        return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        job_id = job_id_in_path(request.path_info)
        if job_id is not None:
            job_log_context_set(job_id=job_id, job_kind=await _akind_of(job_id))
        return await self.get_response(request)


def job_log_context_end(**kwargs: Any) -> None:
    """`request_finished`: the request's job no longer names the lines of this thread."""
    job_log_context_reset()
