"""Websocket consumers: one job's live event stream, and the feed of status changes.

`/ws/jobs/{id}/?after=SEQ` (the contract's "Websockets"):

1. the caller must see the job (`jobs.selectors`), else the socket is closed with 4403;
2. the consumer joins the job's group FIRST, then reads the job: the snapshot's `last_seq` N;
   every event numbered above N is committed after that read, so published after the join,
   so it reaches this consumer (or, if its push is lost, the gap check below finds it);
3. the backlog (`seq` > SEQ) is read from the database in pages;
4. live events follow, deduplicated by `seq`: one at or below the last sent is dropped; one
   that skips numbers first fills the gap from the database. A slow periodic check covers a
   lost push at the end of a burst (a job's last event has no later one to reveal the gap).

`/ws/jobs/`: `{"type": "job", "job": {...}}` for each status change of a job the caller may see.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs.broadcast import FEED_GROUP, job_group
from jobs.errors import JobNotFound
from jobs.models import Job
from jobs.presenters import job_as_dict
from jobs.selectors import job_events_after, job_get_visible, jobs_visible_to

logger = logging.getLogger(__name__)

REFUSED = 4403  # the contract's close code for a caller who may not see the job


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
def _last_seq(job_id: Any) -> int | None:
    return Job.objects.filter(pk=job_id).values_list("event_seq", flat=True).first()


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    """Snapshot, backlog after `?after=`, then live events of one job: no gap, no duplicate."""

    page_size = 500  # events per database read of the backlog or a gap
    resync_interval = 5.0  # seconds between checks for a lost push while the job runs
    resync_interval_finished = 30.0  # ... and once it finished (it may be retried)

    async def connect(self) -> None:
        # Accept first: a close before the handshake completes carries no close code.
        await self.accept()
        self.job_pk: uuid.UUID | None = None  # set once the caller may see the job
        self.last_seq = 0
        self.finished = False
        self.lock = asyncio.Lock()  # one sender at a time: live events, gap fills, resync
        self.resync_task: asyncio.Task | None = None
        try:
            job_pk = uuid.UUID(str(self.scope["url_route"]["kwargs"]["job_id"]))
        except ValueError:
            await self.close(code=REFUSED)
            return
        group = job_group(job_pk)
        # Join before reading the job, so no event committed after the read can be missed.
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups.append(group)  # discarded by the base class on disconnect
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
        self.resync_task = asyncio.create_task(self._resync_forever())

    async def disconnect(self, code: int) -> None:
        if self.resync_task is not None:
            self.resync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.resync_task

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say on this socket; what they send is ignored."""

    # -- channel layer messages ---------------------------------------------------------
    async def job_event(self, message: dict[str, Any]) -> None:
        """A pushed event (`jobs.broadcast.event_publish`)."""
        event = message["event"]
        if self.job_pk is None:
            return  # refused (the group was joined before the check); the close is on its way
        async with self.lock:
            if event["seq"] <= self.last_seq:
                return  # already sent (from the backlog, or pushed twice)
            if event["seq"] == self.last_seq + 1:
                await self._send_event(event)
            else:
                # Pushes in between were lost or are late: the database has them (each row
                # commits before its push), this one included.
                await self._catch_up()

    # -- internals ------------------------------------------------------------------------
    async def _send_event(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "event", "event": event})
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

    async def _resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.resync_interval_finished if self.finished else self.resync_interval)
            try:
                newest = await _last_seq(self.job_pk)
                if newest is not None and newest > self.last_seq:
                    async with self.lock:
                        await self._catch_up()
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup: try again at the next tick
                logger.warning("job %s: resync of websocket %s failed", self.job_pk, self.channel_name, exc_info=True)


class JobFeedConsumer(AsyncJsonWebsocketConsumer):
    """Status changes of every job the caller may see, as `{"type": "job", "job": {...}}`."""

    groups = [FEED_GROUP]  # joined on connect, left on disconnect, by the base class
    cache_size = 10_000

    async def connect(self) -> None:
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=REFUSED)
            return
        self.user = user
        self.visible: dict[str, bool] = {}

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say on this socket; what they send is ignored."""

    async def job_status(self, message: dict[str, Any]) -> None:
        """A job changed status (`jobs.broadcast.event_publish`)."""
        if not hasattr(self, "user"):
            return  # refused; the close is on its way
        job = message["job"]
        if await self._may_see(job, message.get("owner_id")):
            await self.send_json({"type": "job", "job": job})

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
