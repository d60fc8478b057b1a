"""Websocket consumers: one job's live event stream, and the feed of status changes.

`/ws/jobs/{id}/?after=SEQ` (the contract's "Websockets"):

1. the caller must see the job (`jobs.selectors`), else the socket is closed with 4403; a user
   over the cap of live streams is refused with 4429 (`jobs.streams`);
2. the consumer joins the job's group and marks the job followed (`jobs.followed`: a move
   pushes only while it is marked), only for a caller admitted in step 1, then reads the job:
   the snapshot's `last_seq` N;
   every event numbered above N is committed after that read, so written by a move that found
   the mark and published after the join, so it reaches this consumer (or, if its push is lost,
   the gap check below finds it);
3. the backlog (`seq` > SEQ) is read from the database in pages;
4. live events follow, deduplicated by `seq`: one at or below the last sent is dropped; one
   that skips numbers first fills the gap from the database. The registry's periodic check
   (`jobs.streams`) covers a lost push at the end of a burst, which no later event reveals.

`/ws/jobs/`: `{"type": "job", "job": {...}}` for each status change of a job the caller may see,
from every statement that started after the socket opened.

The hot path is per event, not per socket: the process's fan-out (`jobs.fanout`) receives an
event once and calls `deliver` of each follower in one synchronous loop, which writes the frame
that was built once for all (`jobs.wire`) unless the socket is behind (then it catches up from
the database on its own), or too slow to read (then it is dropped with 4408 and reconnects
with `?after=`). No database read and no visibility check happens there: a job stream is
authorised at connect and re-checked by `jobs.streams`; the feed decides what each socket may
see in memory (staff, creator) or with one query per job for all its sockets in this process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections import OrderedDict, deque
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from dbkit.threads import off_request_thread
from jobs.errors import JobNotFound
from jobs.fanout import Batch, LocalFanout, Push
from jobs.followed import FEED_GROUP, job_group
from jobs.models import Job
from jobs.presenters import job_as_dict
from jobs.selectors import job_events_after, job_get_visible, job_visible_to_which
from jobs.streams import OVER_CAP, REFUSED, LiveStreams
from jobs.wire import Wire, text_frame, wire_for

logger = logging.getLogger(__name__)

__all__ = ["REFUSED", "JobEventsConsumer", "JobFeedConsumer"]


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


def event_text(message: dict[str, Any]) -> str:
    """A pushed event as its websocket message (built once per process: `Push.encoded`)."""
    return json.dumps({"type": "event", "event": message["event"]})


def job_text(message: dict[str, Any]) -> str:
    return json.dumps({"type": "job", "job": message["job"]})


def _framed(text_of: Any) -> Any:
    return lambda message: text_frame(text_of(message).encode())


event_frame = _framed(event_text)
job_frame = _framed(job_text)


class EventRun(NamedTuple):
    """A batch of pushed events numbered `first`..`last` with no gap, ready to go out at once."""

    first: int
    last: int
    texts: list[str]
    frames: bytes
    finished: bool | None  # after it: is the job finished (None: no status event in it)


def event_run(pushes: list[Push]) -> EventRun | None:
    """The batch as one run of consecutive events, or None (anything else, or a gap in it)."""
    if any(push.message.get("type") != "job.event" for push in pushes):
        return None
    events = [push.message["event"] for push in pushes]
    if any(later["seq"] != earlier["seq"] + 1 for earlier, later in zip(events, events[1:], strict=False)):
        return None
    statuses = [event["status"] for event in events if event["type"] == "status"]
    return EventRun(
        first=events[0]["seq"], last=events[-1]["seq"],
        texts=[push.encoded("event.text", event_text) for push in pushes],
        frames=b"".join(push.encoded("event.frame", event_frame) for push in pushes),
        finished=statuses[-1] in Job.TERMINAL if statuses else None,
    )


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """A websocket consumer fed by the process's fan-out; everything after `accept` goes out
    through its wire (`jobs.wire`), in order.

    It has no channel-layer channel of its own (`channel_layer_alias = None`), and it skips
    channels' `close_old_connections()` before each message: every database access here goes
    through `database_sync_to_async`, which closes stale connections itself.
    """

    channel_layer_alias = None
    followed: str | None = None
    wire: Wire | None = None
    accepted = False
    admitted = False
    job_pk: Any = None
    last_seq = 0
    finished = False

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    def caller(self) -> tuple[Any, str | None]:
        """The user of the socket, and why they are refused (None when they are not)."""
        self.wire = wire_for(self.scope, self.base_send)
        self.stream_id = uuid.uuid4().hex
        self.credential = self.scope.get("credential")
        self.user = self.scope.get("user")
        refusal = self.scope.get("auth_refused")
        if refusal or self.user is None or not self.user.is_authenticated or not self.user.is_active:
            return None, refusal or "sign in, or connect with ?ticket= from POST /api/ws-tickets/"
        return self.user, None

    async def open(self) -> None:
        await self.accept()
        self.accepted = True

    async def refuse(self, code: int, reason: str) -> None:
        """Accept, then close with `code`: a close before the handshake carries no code."""
        if not self.accepted:
            await self.open()
        self.wire.close(code, reason)

    async def admit(self) -> bool:
        """Count this socket against its user's cap (`jobs.streams`); False when refused."""
        refusal = await LiveStreams.here().admit(self)
        if refusal is not None:
            await self.refuse(OVER_CAP, refusal)
            return False
        self.admitted = True
        return True

    async def follow(self, group: str) -> None:
        """Join `group` (returns once joined); its pushes come to `deliver`."""
        try:
            await LocalFanout.here().follow(group, self)
        except Exception as exc:  # Redis away: no pushes, the periodic check still delivers
            logger.warning("could not join %s: %s: %s", group, type(exc).__name__, exc)
        self.followed = group

    def end(self, code: int, reason: str) -> None:
        """Close the socket now (called by `jobs.streams`: revoked, no longer visible)."""
        self._unfollow()
        if self.wire is not None:
            self.wire.close(code, reason)

    def _unfollow(self) -> None:
        if self.followed is not None:
            LocalFanout.here().unfollow(self.followed, self)
            self.followed = None

    async def disconnect(self, code: int) -> None:
        self._unfollow()
        if self.admitted:
            self.admitted = False
            LiveStreams.here().release(self)
        if self.wire is not None:
            self.wire.stop()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say on these sockets; what they send is ignored."""

    def resync(self) -> None:
        """Nothing to catch up (the feed); see JobEventsConsumer."""


class JobEventsConsumer(LiveConsumer):
    """Snapshot, backlog after `?after=`, then live events of one job: no gap, no duplicate."""

    page_size = 500  # events per database read of the backlog or a gap

    async def connect(self) -> None:
        # Until the first catch-up is done, pushes only mark the socket as behind.
        self.catching_up, self.behind = True, False
        self.catch_up_task: asyncio.Task | None = None
        # Accept first: the client waits for its snapshot, which says from where live events go on.
        await self.open()
        user, refusal = self.caller()
        if user is None:
            await self.refuse(REFUSED, refusal)
            return
        try:
            job_pk = uuid.UUID(str(self.scope["url_route"]["kwargs"]["job_id"]))
        except ValueError:
            await self.refuse(REFUSED, "no such job")
            return
        # Who may follow the job is settled before anything is written for it: a caller who may
        # not see it, or who is over the cap of live streams, marks nothing (`jobs.followed`).
        if await _visible_job(user, job_pk) is None:
            await self.refuse(REFUSED, "no such job, or you may not see it")
            return
        if not await self.admit():
            return
        # Join (and mark the job followed) before the snapshot's read, so no event committed after
        # that read can be missed.
        await self.follow(job_group(job_pk))
        job = await _visible_job(user, job_pk)
        if job is None:  # no longer visible (deleted, access taken away) in between
            self.end(REFUSED, "no such job, or you may not see it")
            return
        self.job_pk = job.pk
        self.finished = job.is_finished
        self.wire.write(json.dumps({"type": "snapshot", "job": job_as_dict(job), "last_seq": job.event_seq}))
        after = _query_int(self.scope, "after")
        self.last_seq = after if after is not None and after < job.event_seq else job.event_seq
        await self._catch_up()

    async def disconnect(self, code: int) -> None:
        self.job_pk = None
        if getattr(self, "catch_up_task", None) is not None:
            self.catch_up_task.cancel()
        await super().disconnect(code)

    def deliver(self, push: Push) -> None:
        """A pushed event (`jobs.broadcast.event_publish`), from the fan-out: must not block."""
        message = push.message
        if message.get("type") != "job.event":
            return
        if self.catching_up:
            self.behind = True  # the catch-up reads the database once more before it stops
            return
        seq = message["event"]["seq"]
        if self.job_pk is None or seq <= self.last_seq:
            return  # already sent (from the backlog, or pushed twice), or the socket is gone
        if seq != self.last_seq + 1:
            # Pushes in between were lost or are late: the database has them (each row commits
            # before its push), this one included.
            self.resync()
            return
        if self.wire.write(push.encoded("event.text", event_text), push.encoded("event.frame", event_frame)):
            self._sent(message["event"])
        else:
            self._unfollow()  # closed, or just dropped as too slow

    def deliver_batch(self, batch: Batch) -> None:
        """Several pushes that came together: one write for all, when they follow on."""
        run = batch.encoded("event.run", event_run)
        if run is None or self.catching_up or self.job_pk is None or self.last_seq != run.first - 1:
            for push in batch.pushes:
                self.deliver(push)
            return
        if self.wire.write_many(run.texts, run.frames):
            self.last_seq = run.last
            if run.finished is not None:
                self.finished = run.finished
        else:
            self._unfollow()  # closed, or just dropped as too slow

    def resync(self) -> None:
        """Catch up from the database (a gap, or a lost push found by `jobs.streams`)."""
        if self.job_pk is None or self.catching_up:
            self.behind = True
            return
        self.catching_up, self.behind = True, True
        self.catch_up_task = asyncio.ensure_future(self._catch_up())

    def _sent(self, event: dict[str, Any]) -> None:
        self.last_seq = event["seq"]
        if event["type"] == "status":
            self.finished = event["status"] in Job.TERMINAL

    async def _catch_up(self) -> None:
        """Send every stored event after the last one sent, in pages, at the client's pace, until
        no push came in meanwhile; then live pushes are written directly again."""
        try:
            while self.job_pk is not None and self.wire.open:
                self.behind = False
                events = await _events_after(self.job_pk, self.last_seq, self.page_size)
                for event in events:
                    if event["seq"] <= self.last_seq:
                        continue
                    if not await self.wire.send(json.dumps({"type": "event", "event": event})):
                        return
                    self._sent(event)
                if len(events) < self.page_size:
                    await self.wire.drained()  # so that the next live write finds room
                    if not self.behind:
                        return
        except asyncio.CancelledError:
            raise
        except Exception:  # a database hiccup: the periodic check tries again
            logger.info("job %s: catching up a websocket failed", self.job_pk, exc_info=True)
        finally:
            self.catching_up = False


class FeedFanout:
    """The one follower of the feed group in a process: sends each status change to the feed
    sockets whose user may see the job.

    Staff see every job and a creator their own, decided in memory. Anyone else may see a job
    through one of its questions: that is decided with one query per job for all such users in
    this process (`job_visible_to_which`), remembered for `LIVE_RECHECK_INTERVAL` seconds, and
    asked again when the job pauses (a question opened). Pushes are handled in order: while one
    waits for its query, the next ones wait behind it.
    """

    cache_size = 10_000  # jobs whose viewers are remembered
    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.sockets: set[JobFeedConsumer] = set()
        self.waiting: deque[Push] = deque()
        self.task: asyncio.Task | None = None
        # job id -> (when asked, {user pk: may see})
        self.viewers: OrderedDict[str, tuple[float, dict[Any, bool]]] = OrderedDict()

    @classmethod
    def here(cls) -> FeedFanout:
        loop = asyncio.get_running_loop()
        fanout = cls._by_loop.get(loop)
        if fanout is None:
            fanout = cls._by_loop[loop] = cls()
        return fanout

    async def add(self, socket: JobFeedConsumer) -> None:
        self.sockets.add(socket)
        await LocalFanout.here().follow(FEED_GROUP, self)

    def discard(self, socket: JobFeedConsumer) -> None:
        self.sockets.discard(socket)
        if not self.sockets:
            LocalFanout.here().unfollow(FEED_GROUP, self)

    def deliver(self, push: Push) -> None:
        if push.message.get("type") != "job.status":
            return
        self.waiting.append(push)
        if self.task is None or self.task.done():
            self._send_waiting()

    def _send_waiting(self) -> None:
        while self.waiting:
            push = self.waiting[0]
            undecided = self._send(push)
            if undecided:
                self.task = asyncio.ensure_future(self._decide_then_go_on(push, undecided))
                return
            self.waiting.popleft()

    def _facts(self, push: Push) -> tuple[Any, bool, dict[Any, bool]]:
        """What deciding who sees `push` needs: the job's creator, whether it paused, and who
        is known to see it (nobody, once that is older than a re-check interval)."""
        message = push.message
        asked_at, known = self.viewers.get(message["job"]["id"], (0.0, {}))
        if time.monotonic() - asked_at > settings.LIVE_RECHECK_INTERVAL:
            known = {}
        return message.get("owner_id"), message["job"]["status"] == Job.Status.PAUSED, known

    @staticmethod
    def _sees(user: Any, facts: tuple[Any, bool, dict[Any, bool]]) -> bool | None:
        """Whether `user` sees the job, decided in memory; None when a query must say."""
        owner_id, paused, known = facts
        if user.is_staff or (owner_id is not None and owner_id == user.pk):
            return True
        visible = known.get(user.pk)
        # A job may become visible when it pauses (a question the caller may answer opened).
        return None if visible is None or (paused and not visible) else visible

    def _send(self, push: Push) -> list[JobFeedConsumer]:
        """Send `push` to the sockets that may see its job; return those not yet known."""
        facts = self._facts(push)
        undecided = []
        for socket in tuple(self.sockets):
            if not socket.accepted:
                continue  # its handshake is not answered yet: this change came before it
            visible = self._sees(socket.user, facts)
            if visible is None:
                undecided.append(socket)
            elif visible:
                socket.send_pushes([push.encoded("job.text", job_text)], push.encoded("job.frame", job_frame))
        return undecided

    def deliver_batch(self, batch: Batch) -> None:
        """Status changes that came together: one write per socket for those it may see."""
        pushes = [push for push in batch.pushes if push.message.get("type") == "job.status"]
        busy = self.waiting or (self.task is not None and not self.task.done())
        if busy or len(pushes) < 2:
            for push in pushes:
                self.deliver(push)
            return
        facts = [self._facts(push) for push in pushes]
        plans = []
        for socket in tuple(self.sockets):
            if not socket.accepted:
                continue
            seen = [self._sees(socket.user, fact) for fact in facts]
            if None in seen:  # a query must decide: one push at a time, in order
                for push in pushes:
                    self.deliver(push)
                return
            plans.append((socket, seen))
        texts = [push.encoded("job.text", job_text) for push in pushes]
        frames = [push.encoded("job.frame", job_frame) for push in pushes]
        joined = b"".join(frames)
        for socket, seen in plans:
            if all(seen):
                socket.send_pushes(texts, joined)
            elif any(seen):
                mine = [index for index, visible in enumerate(seen) if visible]
                socket.send_pushes([texts[i] for i in mine], b"".join(frames[i] for i in mine))

    async def _decide_then_go_on(self, push: Push, sockets: list[JobFeedConsumer]) -> None:
        job_id = push.message["job"]["id"]
        users = {socket.user.pk: socket.user for socket in sockets}
        try:
            seeing = await _visible_to_which(job_id, list(users.values()))
        except Exception:  # a database hiccup: not sent to them; the next push asks again
            logger.warning("feed: who may see job %s could not be read", job_id, exc_info=True)
        else:
            asked_at, known = self.viewers.pop(job_id, (0.0, {}))
            if time.monotonic() - asked_at > settings.LIVE_RECHECK_INTERVAL:
                asked_at, known = time.monotonic(), {}
            known.update({pk: pk in seeing for pk in users})
            self.viewers[job_id] = (asked_at, known)
            while len(self.viewers) > self.cache_size:
                self.viewers.popitem(last=False)
            for socket in sockets:
                if socket.user.pk in seeing and socket in self.sockets:
                    socket.send_pushes([push.encoded("job.text", job_text)], push.encoded("job.frame", job_frame))
        self.waiting.popleft()
        self._send_waiting()


@off_request_thread
def _visible_to_which(job_id: str, users: list[Any]) -> set[Any]:
    return job_visible_to_which(job_id=job_id, users=users)


class JobFeedConsumer(LiveConsumer):
    """Status changes of every job the caller may see, as `{"type": "job", "job": {...}}`."""

    async def connect(self) -> None:
        user, refusal = self.caller()
        if user is None:
            await self.refuse(REFUSED, refusal)
            return
        if not await self.admit():
            return
        # Join before the handshake is answered: a client that sees its socket open gets every
        # status change from then on.
        try:
            await FeedFanout.here().add(self)
        except Exception as exc:  # Redis away: no pushes until it is back
            logger.warning("could not join the feed: %s: %s", type(exc).__name__, exc)
        self.followed = FEED_GROUP
        await self.open()

    def send_pushes(self, texts: list[str], frames: bytes) -> None:
        """Write these status changes (`frames`: the same, framed and joined) at once."""
        if not self.wire.write_many(texts, frames):
            self._unfollow()  # closed, or just dropped as too slow

    def _unfollow(self) -> None:
        if self.followed is not None:
            FeedFanout.here().discard(self)
            self.followed = None
