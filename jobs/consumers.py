"""Websocket consumers: one job's live event stream, and the feed of status changes.

`/ws/jobs/{id}/?after=SEQ` (the contract's "Websockets"):

1. the caller must see the job (`jobs.selectors`), else the socket is closed with 4403;
2. the consumer joins the job's group FIRST, then reads the job: the snapshot's `last_seq` N;
   every event numbered above N is committed after that read, so published after the join,
   so it reaches this consumer (or, if its push is lost, the gap check below finds it);
3. the backlog (`seq` > SEQ) is read from the database in pages;
4. live events follow, deduplicated by `seq`: one at or below the last sent is dropped; one
   that skips numbers first fills the gap from the database. A periodic check per process
   (`LostPushWatch`) covers a lost push at the end of a burst, which no later event reveals.

`/ws/jobs/`: `{"type": "job", "job": {...}}` for each status change of a job the caller may see.

Pushes reach the consumers through `jobs.fanout.LocalFanout` (one channel-layer channel per
server process) rather than a channel per socket; see that module for why.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs.broadcast import FEED_GROUP, job_group
from jobs.errors import JobNotFound
from jobs.fanout import LocalFanout
from jobs.models import Job
from jobs.presenters import job_as_dict
from jobs.selectors import job_events_after, job_get_visible, jobs_visible_to

logger = logging.getLogger(__name__)

REFUSED = 4403  # the contract's close code for a caller who may not see the job
INBOX_SIZE = 1000  # pushes waiting for one slow socket; beyond, they are dropped and refilled from the database


def _query_int(scope: dict, name: str) -> int | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin1")).get(name)
    try:
        value = int(values[0]) if values else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


@database_sync_to_async
def _visible_job(user: Any, job_id: Any) -> Job | None:
    try:
        return job_get_visible(user=user, job_id=job_id)
    except JobNotFound:
        return None


@database_sync_to_async
def _events_after(job_id: Any, after: int, limit: int) -> list[dict[str, Any]]:
    return [event.as_dict() for event in job_events_after(job_id=job_id, after=after, limit=limit)]


@database_sync_to_async
def _newest_seqs(job_ids: list[Any]) -> dict[Any, int]:
    newest: dict[Any, int] = {}
    for start in range(0, len(job_ids), 500):
        newest.update(Job.objects.filter(pk__in=job_ids[start:start + 500]).values_list("pk", "event_seq"))
    return newest


class PushedConsumer(AsyncJsonWebsocketConsumer):
    """A websocket consumer fed by `LocalFanout`: pushes queue in an inbox, one task handles them.

    It has no channel-layer channel of its own (`channel_layer_alias = None`), and it skips
    channels' `close_old_connections()` before each message (one thread hop, about 0.1 ms, per
    event per socket): every database access here goes through `database_sync_to_async`, which
    closes stale connections itself.
    """

    channel_layer_alias = None
    followed: str | None = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def follow(self, group: str) -> None:
        """Join `group` (returns once joined) and start handling its pushes after `connect`."""
        self.inbox: asyncio.Queue = asyncio.Queue(INBOX_SIZE)
        self.pump: asyncio.Task | None = None
        try:
            await LocalFanout.here().follow(group, self)
        except Exception as exc:  # Redis away: no pushes, the periodic check still delivers
            logger.warning("could not join %s: %s: %s", group, type(exc).__name__, exc)
        self.followed = group

    def start_pump(self) -> None:
        self.pump = asyncio.ensure_future(self._pump_forever())

    def deliver(self, message: dict[str, Any]) -> None:
        """Called by the fan-out for each push (must not block)."""
        try:
            self.inbox.put_nowait(message)
        except asyncio.QueueFull:  # a client too slow to read: the gap check refills from the database
            pass

    async def _pump_forever(self) -> None:
        while True:
            message = await self.inbox.get()
            try:
                await self.dispatch(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("websocket %s: a push could not be handled", id(self))

    async def disconnect(self, code: int) -> None:
        if self.followed is not None:
            LocalFanout.here().unfollow(self.followed, self)
            self.followed = None
        if getattr(self, "pump", None) is not None:
            self.pump.cancel()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say on these sockets; what they send is ignored."""


class LostPushWatch:
    """One task per event loop (so per server process) that finds pushes lost at the end of a
    burst: every `JobEventsConsumer.resync_interval` it reads the newest seq of all the jobs its
    consumers follow in one query, and has the consumers that are behind catch up."""

    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.consumers: weakref.WeakSet = weakref.WeakSet()
        self.task: asyncio.Task | None = None

    @classmethod
    def here(cls) -> LostPushWatch:
        loop = asyncio.get_running_loop()
        watch = cls._by_loop.get(loop)
        if watch is None:
            watch = cls._by_loop[loop] = cls()
        return watch

    def follow(self, consumer: JobEventsConsumer) -> None:
        self.consumers.add(consumer)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        tick = 0
        while len(self.consumers):
            await asyncio.sleep(JobEventsConsumer.resync_interval)
            tick += 1
            # A finished job can only move again by a retry: look at those 6 times less often.
            due = [c for c in list(self.consumers) if c.job_pk is not None and (not c.finished or tick % 6 == 0)]
            if not due:
                continue
            try:
                newest = await _newest_seqs(list({c.job_pk for c in due}))
            except Exception:  # a database hiccup: try again at the next tick
                logger.warning("lost-push check failed", exc_info=True)
                continue
            for consumer in due:
                if newest.get(consumer.job_pk, 0) > consumer.last_seq:
                    asyncio.ensure_future(consumer.resync())


class JobEventsConsumer(PushedConsumer):
    """Snapshot, backlog after `?after=`, then live events of one job: no gap, no duplicate."""

    page_size = 500  # events per database read of the backlog or a gap
    resync_interval = 5.0  # seconds between two checks for lost pushes (see LostPushWatch)

    async def connect(self) -> None:
        # Accept first: a close before the handshake completes carries no close code.
        await self.accept()
        self.job_pk: uuid.UUID | None = None  # set once the caller may see the job
        self.last_seq = 0
        self.finished = False
        self.lock = asyncio.Lock()  # one sender at a time: live events, gap fills, resync
        try:
            job_pk = uuid.UUID(str(self.scope["url_route"]["kwargs"]["job_id"]))
        except ValueError:
            await self.close(code=REFUSED)
            return
        # Join before reading the job, so no event committed after the read can be missed.
        await self.follow(job_group(job_pk))
        job = await _visible_job(self.scope.get("user"), job_pk)
        if job is None:
            await self.close(code=REFUSED)
            return
        self.job_pk = job.pk
        self.finished = job.is_finished
        await self.send_json({"type": "snapshot", "job": job_as_dict(job), "last_seq": job.event_seq})
        after = _query_int(self.scope, "after")
        self.last_seq = after if after is not None and after < job.event_seq else job.event_seq
        async with self.lock:
            await self._catch_up()
        self.start_pump()  # pushes that came meanwhile wait in the inbox, then are deduplicated
        LostPushWatch.here().follow(self)

    async def disconnect(self, code: int) -> None:
        self.job_pk = None
        await super().disconnect(code)

    async def job_event(self, message: dict[str, Any]) -> None:
        """A pushed event (`jobs.broadcast.event_publish`)."""
        event = message["event"]
        async with self.lock:
            if self.job_pk is None or event["seq"] <= self.last_seq:
                return  # already sent (from the backlog, or pushed twice), or the socket is gone
            if event["seq"] == self.last_seq + 1:
                await self._send_event(event, frame=message.get("frame"))
            else:
                # Pushes in between were lost or are late: the database has them (each row
                # commits before its push), this one included.
                await self._catch_up()

    async def resync(self) -> None:
        """Catch up from the database (a push was lost); called by `LostPushWatch`."""
        try:
            async with self.lock:
                if self.job_pk is not None:
                    await self._catch_up()
        except Exception:  # the socket closed meanwhile, or a database hiccup: the next tick retries
            logger.info("job %s: catching up a websocket failed", self.job_pk, exc_info=True)

    async def _send_event(self, event: dict[str, Any], frame: str | None = None) -> None:
        # `frame` is the message as the publisher encoded it once for every client.
        await self.send(text_data=frame or await self.encode_json({"type": "event", "event": event}))
        self.last_seq = event["seq"]
        if event["type"] == "status":
            self.finished = event["status"] in Job.TERMINAL

    async def _catch_up(self) -> None:
        """Send every stored event after the last one sent, in pages. Caller holds the lock."""
        while True:
            events = await _events_after(self.job_pk, self.last_seq, self.page_size)
            for event in events:
                await self._send_event(event)
            if len(events) < self.page_size:
                return


class JobFeedConsumer(PushedConsumer):
    """Status changes of every job the caller may see, as `{"type": "job", "job": {...}}`."""

    cache_size = 10_000

    async def connect(self) -> None:
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=REFUSED)
            return
        self.user = user
        self.visible: dict[str, bool] = {}
        await self.follow(FEED_GROUP)
        self.start_pump()

    async def job_status(self, message: dict[str, Any]) -> None:
        """A job changed status (`jobs.broadcast.event_publish`)."""
        job = message["job"]
        if await self._may_see(job, message.get("owner_id")):
            await self.send(text_data=message.get("frame") or await self.encode_json({"type": "job", "job": job}))

    async def _may_see(self, job: dict[str, Any], owner_id: Any) -> bool:
        # The two cheap cases of `jobs_visible_to`, without a query: staff, and the creator.
        if self.user.is_staff or (owner_id is not None and owner_id == self.user.pk):
            return True
        known = self.visible.get(job["id"])
        # A job may become visible when it pauses (a question the caller may answer opened).
        if known is True or (known is False and job["status"] != Job.Status.PAUSED):
            return known
        visible = await database_sync_to_async(self._visible_in_db)(job["id"])
        if len(self.visible) >= self.cache_size:
            self.visible.clear()
        self.visible[job["id"]] = visible
        return visible

    def _visible_in_db(self, job_id: str) -> bool:
        return jobs_visible_to(self.user).filter(pk=job_id).exists()
