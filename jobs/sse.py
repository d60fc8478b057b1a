"""`GET /api/jobs/{id}/events/stream/`: a job's events as Server-Sent Events.

Each event is sent as `id: <seq>`, `event: <type>`, `data: <the event's JSON>`. A client that
reconnects sends `Last-Event-ID` (browsers' EventSource do so by themselves) and gets what came
after it; `?after=SEQ` does the same for a first connection. The stream ends once the job is
finished and its last event was sent.

The database is the source: the view reads new rows after the last one sent. To learn of them
quickly it also listens to the job's channel group, and reads again at least every second when
no push arrives (a lost push delays an event, never loses it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from accounts.services import api_token_authenticate
from jobs.broadcast import job_group
from jobs.errors import JobNotFound
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
        token = await sync_to_async(api_token_authenticate)(key=header[len("Token "):].strip())
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


async def job_events_stream(request: HttpRequest, job_id: Any) -> HttpResponse:
    """Stream the job's events after `Last-Event-ID` (or `?after=`) until the job is finished."""
    if request.method != "GET":
        return _error(405, "method_not_allowed", "use GET")
    user, bad_token = await _caller(request)
    if user is None or not user.is_authenticated:
        response = _error(
            401, "not_authenticated",
            "invalid or revoked token" if bad_token else "send Authorization: Token <key>, or sign in",
        )
        response["WWW-Authenticate"] = "Token"
        return response
    try:
        job = await sync_to_async(job_get_visible)(user=user, job_id=job_id)
    except JobNotFound as exc:
        return _error(404, exc.code, exc.message)
    response = StreamingHttpResponse(_stream(job.pk, _after(request)), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


@sync_to_async
def _read(job_pk: Any, after: int) -> tuple[str, int, list[dict[str, Any]]]:
    # The job's state first: events read after it include everything up to its event_seq.
    status, last_seq = Job.objects.filter(pk=job_pk).values_list("status", "event_seq").get()
    events = job_events_after(job_id=job_pk, after=after, limit=PAGE_SIZE)
    return status, last_seq, [event.as_dict() for event in events]


async def _stream(job_pk: Any, after: int) -> AsyncIterator[str]:
    layer = get_channel_layer()
    group = job_group(job_pk)
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    push: asyncio.Future | None = None
    quiet_since = time.monotonic()
    try:
        yield "retry: 2000\n\n"
        while True:
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
            if push is None:
                push = asyncio.ensure_future(layer.receive(channel))
            done, _ = await asyncio.wait([push], timeout=POLL_INTERVAL)
            if done:
                failed, push = push.exception(), None  # something happened: read the database
                if failed is not None:  # the channel layer is down: fall back to polling
                    logger.warning("job %s: stream lost its channel layer: %s", job_pk, failed)
                    await asyncio.sleep(POLL_INTERVAL)
            elif time.monotonic() - quiet_since > KEEPALIVE_INTERVAL:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
    finally:
        if push is not None:
            push.cancel()
        try:
            await layer.group_discard(group, channel)
        except Exception:  # expires with the group anyway
            logger.debug("could not leave %s", group, exc_info=True)
