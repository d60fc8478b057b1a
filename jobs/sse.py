"""`GET /api/jobs/{id}/events/stream/`: a job's events as Server-Sent Events.

Each event is sent as `id: <seq>`, `event: <type>`, `data: <the event's JSON>`. A client that
reconnects sends `Last-Event-ID` (browsers' EventSource do so by themselves) and gets what came
after it; `?after=SEQ` does the same for a first connection. The stream ends once the job is
finished and its last event was sent.

The database is the source: the view reads new rows after the last one sent. To learn of them
quickly it follows the job's group through the process's fan-out (`jobs.fanout`), and reads
again at least every second when no push arrives (a lost push delays an event, never loses it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET

from accounts.services import api_token_authenticate
from jobs.broadcast import job_group
from jobs.errors import JobNotFound
from jobs.fanout import LocalFanout
from jobs.models import Job
from jobs.selectors import job_events_after, job_get_visible

logger = logging.getLogger(__name__)

PAGE_SIZE = 500
POLL_INTERVAL = 1.0  # seconds: read the database at least this often while waiting
KEEPALIVE_INTERVAL = 15.0  # seconds of silence before a comment line keeps proxies from hanging up


async def _caller(request: HttpRequest) -> tuple[Any, bool]:
    """The user making the request, and whether a token was offered (and refused)."""
    header = request.headers.get("Authorization", "")
    if header.startswith("Token "):
        token = await database_sync_to_async(api_token_authenticate)(key=header[len("Token "):].strip())
        return (token.user if token is not None else None), token is None
    return await request.auser(), False


def _after(request: HttpRequest) -> int:
    for raw in (request.headers.get("Last-Event-ID"), request.GET.get("after")):
        if raw:
            try:
                return max(int(raw), 0)
            except ValueError:
                continue
    return 0


def _frame(event: dict[str, Any]) -> str:
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)


@require_GET
async def job_events_stream(request: HttpRequest, job_id: Any) -> HttpResponse:
    """Stream the job's events after `Last-Event-ID` (or `?after=`) until the job is finished."""
    user, bad_token = await _caller(request)
    if user is None or not user.is_authenticated:
        response = _error(
            401, "not_authenticated",
            "invalid or revoked token" if bad_token else "send Authorization: Token <key>, or sign in",
        )
        response["WWW-Authenticate"] = "Token"
        return response
    try:
        job = await database_sync_to_async(job_get_visible)(user=user, job_id=job_id)
    except JobNotFound as exc:
        return _error(404, exc.code, exc.message)
    response = StreamingHttpResponse(_stream(job.pk, _after(request)), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


# Off the request's own thread (thread_sensitive=False): under ASGI each request keeps a thread
# of its own for thread-sensitive calls, for as long as it streams. database_sync_to_async
# closes the connection after each read (CONN_MAX_AGE permitting), so a long stream does not
# hold a connection between reads.
@partial(database_sync_to_async, thread_sensitive=False)
def _read(job_pk: Any, after: int) -> tuple[str, int, list[dict[str, Any]]]:
    # The job's state first: events read after it include everything up to its event_seq.
    status, last_seq = Job.objects.filter(pk=job_pk).values_list("status", "event_seq").get()
    events = job_events_after(job_id=job_pk, after=after, limit=PAGE_SIZE)
    return status, last_seq, [event.as_dict() for event in events]


class _Wakeup:
    """Follows the job's group through the process's fan-out; a push only means "read again"."""

    def __init__(self) -> None:
        self.pushed = asyncio.Event()

    def deliver(self, message: dict[str, Any]) -> None:
        self.pushed.set()


async def _stream(job_pk: Any, after: int) -> AsyncIterator[str]:
    group = job_group(job_pk)
    fanout = LocalFanout.here()
    wakeup = _Wakeup()
    try:
        await fanout.follow(group, wakeup)
    except Exception as exc:  # no pushes: the stream still reads the database every second
        logger.warning("job %s: stream cannot join %s: %s", job_pk, group, exc)
    quiet_since = time.monotonic()
    try:
        yield "retry: 2000\n\n"
        while True:
            wakeup.pushed.clear()  # before the read: a push that lands during it wakes the wait below
            try:
                status, last_seq, events = await _read(job_pk, after)
            except Job.DoesNotExist:
                return  # deleted while streaming
            for event in events:
                yield _frame(event)
                after = event["seq"]
            if events:
                quiet_since = time.monotonic()
            if len(events) == PAGE_SIZE:
                continue
            if status in Job.TERMINAL and after >= last_seq:
                return
            try:
                await asyncio.wait_for(wakeup.pushed.wait(), POLL_INTERVAL)
            except TimeoutError:
                if time.monotonic() - quiet_since > KEEPALIVE_INTERVAL:
                    yield ": keep-alive\n\n"
                    quiet_since = time.monotonic()
    finally:
        fanout.unfollow(group, wakeup)
