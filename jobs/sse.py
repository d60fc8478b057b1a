"""`GET /api/jobs/{id}/events/stream/`: a job's events as Server-Sent Events.

Each event is sent as `id: <seq>`, `event: <type>`, `data: <the event's JSON>`. A client that
reconnects sends `Last-Event-ID` (browsers' EventSource do so by themselves) and gets what came
after it; `?after=SEQ` does the same for a first connection. The stream ends once the job is
finished and its last event was sent.

A stream shares its web process's fan-out with the websockets (`jobs.fanout`): it follows the
job's group, and a pushed event that comes next in order goes out as it was pushed, its SSE frame
built once for every stream of the process. The database is read only for the backlog, to fill
a gap, and when the process's registry of live streams (`jobs.streams`) finds a push lost; no
stream polls on its own. The registry also counts the stream against its user's cap (429 over
it) and re-checks its credential and the job's visibility, ending the stream when they fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET

from accounts.services import api_token_authenticate
from dbkit.threads import off_request_thread
from jobs.errors import JobNotFound
from jobs.fanout import LocalFanout, Push
from jobs.followed import job_group
from jobs.models import Job
from jobs.selectors import job_events_after, job_get_visible
from jobs.streams import LiveStreams

logger = logging.getLogger(__name__)

PAGE_SIZE = 500
KEEPALIVE_INTERVAL = 15.0  # seconds of silence before a comment line keeps proxies from hanging up
BACKLOG = 1000  # frames waiting for a slow reader; beyond, the stream reads the database instead


async def _caller(request: HttpRequest) -> tuple[Any, tuple[str, str] | None, bool]:
    """The user making the request, the credential it came with, and whether a token was
    offered (and refused)."""
    header = request.headers.get("Authorization", "")
    if header.startswith("Token "):
        token = await database_sync_to_async(api_token_authenticate)(key=header[len("Token "):].strip())
        if token is None:
            return None, None, True
        return token.user, ("token", str(token.pk)), False
    user = await request.auser()
    return user, ("session", request.session.session_key or ""), False


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


def _pushed_frame(message: dict[str, Any]) -> str:
    return _frame(message["event"])


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)


@require_GET
async def job_events_stream(request: HttpRequest, job_id: Any) -> HttpResponse:
    """Stream the job's events after `Last-Event-ID` (or `?after=`) until the job is finished."""
    user, credential, bad_token = await _caller(request)
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
    stream = EventStream(user=user, credential=credential, job_pk=job.pk, after=_after(request))
    refusal = await LiveStreams.here().admit(stream)
    if refusal is not None:
        return _error(429, "too_many_streams", refusal)
    response = EventStreamResponse(stream)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


class EventStreamResponse(StreamingHttpResponse):
    """The stream's response; closing it (Django does, however the request ends, even before
    the first byte) ends the stream and gives its place under the user's cap back."""

    def __init__(self, stream: EventStream) -> None:
        super().__init__(stream.frames(), content_type="text/event-stream")
        self.stream = stream
        self.loop = asyncio.get_running_loop()

    def close(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.stream.stop)  # Django closes it from a thread
        except RuntimeError:  # the loop is gone, and the stream with it
            pass
        super().close()


# Off the request's own thread: under ASGI each request keeps a thread of its own for
# thread-sensitive calls, for as long as it streams; and the connection goes back after each
# read, so a long stream does not hold one between reads.
@off_request_thread
def _read(job_pk: Any, after: int) -> tuple[str, int, list[dict[str, Any]]]:
    # The job's state first: events read after it include everything up to its event_seq.
    status, last_seq = Job.objects.filter(pk=job_pk).values_list("status", "event_seq").get()
    events = job_events_after(job_id=job_pk, after=after, limit=PAGE_SIZE)
    return status, last_seq, [event.as_dict() for event in events]


class EventStream:
    """One SSE stream: a follower of the job's group (`deliver`) and a live stream of the
    process's registry (`jobs.streams.Stream`)."""

    def __init__(self, *, user: Any, credential: tuple[str, str] | None, job_pk: Any, after: int) -> None:
        self.stream_id = uuid.uuid4().hex
        self.user, self.credential, self.job_pk = user, credential, job_pk
        self.last_seq = after  # the last seq queued for the client
        self.finished = False  # its terminal status event is queued
        self.frames_waiting: deque[str] = deque()
        self.catching_up, self.behind = True, False
        self.ended: str | None = None
        self.wakeup = asyncio.Event()
        self.group = job_group(job_pk)

    # -- from the fan-out and the registry (must not block) ------------------------------------
    def deliver(self, push: Push) -> None:
        message = push.message
        if message.get("type") != "job.event":
            return
        event = message["event"]
        if self.catching_up:
            self.behind = True  # the catch-up reads the database once more before it stops
            return
        if event["seq"] <= self.last_seq:
            return  # already queued
        if event["seq"] != self.last_seq + 1 or len(self.frames_waiting) >= BACKLOG:
            self.resync()  # a gap, or a reader too slow: the database has it all
            return
        self.frames_waiting.append(push.encoded("event.sse", _pushed_frame))
        self._queued(event)
        self.wakeup.set()

    def resync(self) -> None:
        self.catching_up = self.behind = True
        self.wakeup.set()

    def end(self, code: int, reason: str) -> None:
        self.ended = reason
        self.wakeup.set()

    def stop(self) -> None:
        """The response is closed: forget the stream (idempotent)."""
        LocalFanout.here().unfollow(self.group, self)
        LiveStreams.here().release(self)

    def _queued(self, event: dict[str, Any]) -> None:
        self.last_seq = event["seq"]
        if event["type"] == "status":
            self.finished = event["status"] in Job.TERMINAL

    # -- the response's body -------------------------------------------------------------------
    async def frames(self) -> AsyncIterator[str]:
        try:
            await LocalFanout.here().follow(self.group, self)
        except Exception as exc:  # no pushes: the registry's periodic check still finds the events
            logger.warning("job %s: stream cannot join %s: %s", self.job_pk, self.group, exc)
        quiet_since = time.monotonic()
        try:
            yield "retry: 2000\n\n"
            while self.ended is None:
                self.wakeup.clear()
                while self.frames_waiting:
                    yield self.frames_waiting.popleft()
                    quiet_since = time.monotonic()
                if self.catching_up:
                    try:
                        status = await self._catch_up()
                    except Job.DoesNotExist:
                        return  # deleted while streaming
                    if status in Job.TERMINAL and not self.frames_waiting:
                        return
                    continue
                if self.finished:
                    return
                try:
                    await asyncio.wait_for(self.wakeup.wait(), KEEPALIVE_INTERVAL)
                except TimeoutError:
                    if time.monotonic() - quiet_since >= KEEPALIVE_INTERVAL:
                        yield ": keep-alive\n\n"
                        quiet_since = time.monotonic()
        finally:
            self.stop()

    async def _catch_up(self) -> str:
        """Queue the stored events after the last one queued, until no push came in meanwhile.
        Returns the job's status when the job is finished and everything was queued, else ''."""
        while True:
            self.behind = False
            status, last_seq, events = await _read(self.job_pk, self.last_seq)
            for event in events:
                if event["seq"] > self.last_seq:
                    self.frames_waiting.append(_frame(event))
                    self._queued(event)
            if len(events) < PAGE_SIZE and not self.behind:
                self.catching_up = False
                return status if self.last_seq >= last_seq else ""
            if len(self.frames_waiting) >= BACKLOG:
                return ""  # send these first; catching_up stays set, so the loop comes back
