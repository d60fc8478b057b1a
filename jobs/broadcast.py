"""Push committed job events to websocket clients through the channel layer.

The durable event log (`jobs.events`) is the truth; this is only the fast path on top of it. A
push that is lost (Redis restarting, a client's channel over capacity) costs a client a database
read, never an event: consumers fill any gap in `seq` from the database.

Every process (a Celery worker child, the ASGI server, a management command) publishes through
ONE daemon thread and ONE channel layer with its own Redis connections, created on first use.
`async_to_sync(layer.group_send)` per event would build a new loop and a new Redis connection
each time (slow, and it leaks connections: channels_redis #100, #125, #332). After a fork
(Celery's prefork children) the child starts its own on first use.

`publish` only hands the message to that thread and returns at once, so it never blocks the
caller, sync or async. Messages to one group are sent in the order they were published.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import select
import ssl
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import hiredis
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from redis.connection import HiredisRespSerializer

from jobs.followed import EVERYONE, FEED_GROUP, job_group
from jobs.models import Job, JobEvent
from jobs.presenters import job_as_dict

logger = logging.getLogger(__name__)

# Sends waiting in one process beyond this are dropped (and logged): with Redis down, memory
# must not grow without bound. The log stays complete; clients catch up from the database.
MAX_PENDING = 10_000
# Messages taken from the queue at once: one round trip asks which of their groups anyone follows.
BATCH = 500


# Answers of a Redis that ran nothing of the script: it no longer has it (`SCRIPT FLUSH`), it is
# a replica now (a failover the connection outlived), or it is loading or has lost its master.
REFUSED_UNRUN = ("NOSCRIPT", "READONLY", "LOADING", "MASTERDOWN")


class DirectPush:
    """A connection of this process to the channel layer's Redis on which pushes are written by
    the thread that publishes them, without waiting for Redis's answer: one non-blocking write
    of one script (`RedisChannelLayer.push_command`) per event, no hand-off to another thread.

    Handing each push to the publisher's thread cost a pool process more than the push itself:
    the thread woke for every event and took the GIL from the job's thread, which then waited
    for it back (about 35 futex calls per no-op job under `strace`; bench/README.md, "The push
    without the hand-off"). The answers are read later, when they are there (a non-blocking read
    before each write, and `drain`), so an error is logged, never waited for.

    Writes never block: the socket is non-blocking, and a write the kernel cannot take at once
    (Redis has stopped reading) fails the connection, as any error does. The publisher then
    sends through its thread again and connects a new one (`Publisher`); its thread closes the
    connection given up once Redis has answered what was written on it (`Publisher._retire`).
    """

    # A larger write (a job whose input or result is large, on the feed) goes through the thread:
    # the kernel may not take it at once, and a write it cannot take gives the connection up.
    max_write = 64 * 1024
    # Pushes written in one command at most: more at once (a batch's first events) are written
    # as several commands, one write each (`Publisher.send_all`).
    max_pushes = 32
    # Bytes asked for at once when reading the answers (a push's answer is a few bytes): a read
    # that gives less took all there was, and a second read would only find the socket empty.
    read_size = 65536

    def __init__(self, layer: Any, connection: Any) -> None:
        self.layer = layer
        self.connection = connection  # redis-py's, connected: its socket is written directly
        self.socket = connection._sock
        self.socket.setblocking(False)
        self.reader = hiredis.Reader()
        self.pack = _packer(connection)
        self.unanswered: deque[list[tuple[str, dict[str, Any]]]] = deque()  # the pushes of each write, in order

    def send(self, pushes: list[tuple[str, dict[str, Any]]]) -> None:
        """Write the pushes' command, first taking whatever answers have come. Raises `Unsent`
        (with these pushes, and any Redis refused unrun) when it cannot: the connection is then
        unusable."""
        try:
            self.read()  # also finds a connection Redis has closed (a restart) before writing to it
        except Unsent as exc:
            raise Unsent(exc.reason, [*exc.pushes, *pushes]) from None
        except OSError as exc:
            raise Unsent(f"{type(exc).__name__}: {exc}", pushes) from None
        data = self.pack(self.layer.push_command(pushes))
        if len(data) > self.max_write:
            raise Unsent(f"{len(data)} bytes", pushes, usable=True)
        try:
            sent = self.socket.send(data)
        except OSError as exc:
            raise Unsent(f"{type(exc).__name__}: {exc}", pushes) from None
        if sent != len(data):
            # Redis gets a cut command, then the connection's close: it runs none of it.
            raise Unsent(f"Redis took {sent} of {len(data)} bytes at once", pushes)
        self.unanswered.append(pushes)

    def read(self) -> None:
        """Take the answers that have come, without waiting; log the errors among them. A push
        that Redis refused before running any of it (`REFUSED_UNRUN`: it lost the script, or
        the server became a replica) is raised back (`Unsent`) with the others refused, to go
        another way: a new connection loads the script, and finds the master through the
        Sentinels. So are the pushes written after it whose answers have not come yet: this
        connection is given up, their answers would never be read, and Redis refuses them as it
        refused the first (were one run after all, a job's stream drops its second copy by its
        `seq`, and the feed says the same status twice)."""
        refused: list[tuple[str, dict[str, Any]]] = []
        refused_reason = ""
        while True:
            try:
                data = self.socket.recv(self.read_size)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            if not data:
                raise OSError("Redis closed the connection")
            self.reader.feed(data)
            more = len(data) == self.read_size  # else the answers there were are all read: no second call
            while (answer := self.reader.gets()) is not False:
                pushes = self.unanswered.popleft()
                if isinstance(answer, hiredis.ReplyError):
                    if str(answer).startswith(REFUSED_UNRUN):
                        refused.extend(pushes)
                        refused_reason = str(answer)
                    else:
                        logger.warning("job event push refused by Redis: %s", answer)
                elif answer:
                    logger.info("job event push: %s channel key(s) over capacity, skipped", answer)
            if not more:
                break
        if refused:
            unanswered = [push for pushes in self.unanswered for push in pushes]
            self.unanswered.clear()
            after = f" (and {len(unanswered)} written after, unanswered yet)" if unanswered else ""
            raise Unsent(f"Redis ran none of {len(refused)} push(es){after}: {refused_reason}",
                         [*refused, *unanswered])

    def drain(self, deadline: float) -> bool:
        """Wait (until the monotonic `deadline`) for the answers to every push written: then
        Redis has them all. False on timeout; `Unsent` as `read`."""
        while self.unanswered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            select.select([self.socket], [], [], remaining)
            try:
                self.read()
            except OSError as exc:
                raise Unsent(f"{type(exc).__name__}: {exc}", []) from None
        return True

    def close(self) -> None:
        try:
            self.socket.setblocking(True)
            self.connection.disconnect()
        except Exception:  # closing a broken connection: nothing to save
            pass


def _packer(connection: Any) -> Any:
    """The function that writes a command (a list of its arguments: str, bytes, int or float) as
    `connection` would send it. With hiredis, its packer itself: redis-py's wrapper around it only
    copies the arguments into a new tuple, which cost a push as much again as the packing."""
    packer = connection._command_packer
    if isinstance(packer, HiredisRespSerializer):
        return lambda command: hiredis.pack_command(tuple(command))
    return lambda command: b"".join(packer.pack(*command))


class Unsent(Exception):
    """The direct path did not send `pushes` (`reason`); they may go another way. The connection
    is unusable after it, unless `usable` (the pushes were too large to write directly)."""

    def __init__(self, reason: str, pushes: list[tuple[str, dict[str, Any]]], usable: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.pushes, self.usable = reason, pushes, usable


class Publisher:
    """One channel layer for one process, and a daemon thread for what cannot go directly.

    The direct path (`DirectPush`): once the thread has connected it, a push is written by the
    thread that publishes it, as one script that finds the group's members and adds the message
    to their keys, without waiting for the answer. Used while nothing is queued for the thread,
    so that messages keep their order within a group.

    The thread's path, at the start, while Redis is away, and for a channel layer the script
    cannot serve: sends are queued and taken by the thread in batches. A batch asks Redis once
    which of its groups anyone follows, and who (`group_members_now`, one script per Redis
    host), and sends only to those, each message one more round trip (`group_send_now` with the
    members it was given). The thread uses plain blocking sockets (the layer's `…_now`
    methods); a channel layer without those gets its own `group_send`, awaited on a loop of
    this thread. While the direct path is down, the thread tries to connect it again every
    `reconnect_interval` seconds.
    """

    reconnect_interval = 1.0  # seconds between two attempts to connect the direct path
    # Seconds the direct path's connect may take (on the publisher's thread); once connected its
    # socket is non-blocking.
    direct_timeout = 2.0

    def __init__(self, alias: str = DEFAULT_CHANNEL_LAYER, direct: bool = True) -> None:
        self.pid = os.getpid()
        self.layer = channel_layers.make_backend(alias)
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()  # appended by any thread
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the thread waits on it for sends
        self._done = threading.Condition(self._lock)  # `flush` waits on it for the thread
        self._sending = False  # the thread holds a batch (under the lock)
        self._loop: asyncio.AbstractEventLoop | None = None  # only for another channel layer
        can_push = getattr(self.layer, "can_push_directly", None)  # taskplatform.channel_layer
        self._direct_wanted = direct and can_push is not None and can_push()
        self._direct: DirectPush | None = None  # used under the lock, by whoever publishes
        self._retired: list[DirectPush] = []  # given up, for the thread to close (`_retire`)
        self._direct_tried = 0.0  # time.monotonic() of the last attempt to connect it
        self._thread = threading.Thread(target=self._run, name="job-event-publisher", daemon=True)
        self._thread.start()

    def send(self, group: str, message: dict[str, Any]) -> None:
        """Push `message` to `group` without waiting (thread-safe)."""
        self.send_all([(group, message)])

    def send_all(self, pushes: list[tuple[str, dict[str, Any]]]) -> None:
        """Push each (group, message) in order, without waiting (thread-safe): written at once
        on the direct path, or queued for the thread."""
        if len(self._queue) >= MAX_PENDING:
            logger.warning("job event publisher: %d sends pending, dropped %d", len(self._queue), len(pushes))
            return
        with self._lock:
            direct = self._direct
            if direct is not None and not self._queue and not self._sending:
                size = direct.max_pushes
                for start in range(0, len(pushes), size):
                    try:
                        direct.send(pushes[start:start + size])
                    except Unsent as exc:  # the thread sends these and the rest (and all, until it reconnects)
                        if not exc.usable:
                            self._direct_lost(direct, exc)
                        pushes = [*exc.pushes, *pushes[start + size:]]
                        break
                else:
                    return
            self._queue.extend(pushes)
            self._work.notify()  # wakes the thread if it waits; nothing to do while it sends

    # -- on the publisher's thread -----------------------------------------------------------
    def _run(self) -> None:
        self._warm()
        self._connect_direct()
        while True:
            with self._lock:
                while not self._queue and not self._retired:
                    self._sending = False
                    self._done.notify_all()
                    if self._reconnect_due():
                        break
                    self._work.wait(self._reconnect_in())
                retired, self._retired = self._retired, []
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                self._sending = bool(batch or retired)
            if retired:
                batch[:0] = self._retire(retired)  # what Redis refused of them came before the batch
            if batch:
                try:
                    self._send_batch(batch)
                except Exception as exc:  # a lost push costs a client a database read, never an event
                    logger.warning("job event publish of %d message(s) failed: %s: %s", len(batch),
                                   type(exc).__name__, exc)
            if self._reconnect_due():
                self._connect_direct()

    def _reconnect_in(self) -> float | None:
        """Seconds until the thread tries to connect the direct path again (None: no need)."""
        if self._direct is not None or not self._direct_wanted:
            return None
        return max(0.0, self._direct_tried + self.reconnect_interval - time.monotonic())

    def _reconnect_due(self) -> bool:
        return self._reconnect_in() == 0.0

    def _warm(self) -> None:
        """Open the connections before the first send needs them (a new pool process starts its
        publisher at once: `jobs.tasks.connect_before_the_first_job`)."""
        warm_now = getattr(self.layer, "warm_now", None)  # taskplatform.channel_layer
        if warm_now is None:
            return
        try:
            warm_now()
        except Exception as exc:  # Redis away: the first send connects (or fails) as it would have
            logger.warning("job event publisher could not connect ahead: %s: %s", type(exc).__name__, exc)

    def _connect_direct(self) -> None:
        """Connect the direct path (blocking this thread, never a publisher's)."""
        if not self._direct_wanted:
            return
        self._direct_tried = time.monotonic()
        try:
            direct = DirectPush(self.layer, self.layer.push_connection(self.direct_timeout))
        except Exception as exc:  # Redis away: the thread sends, and tries again later
            logger.info("job event publisher: no direct connection yet: %s: %s", type(exc).__name__, exc)
            return
        with self._lock:
            self._direct = direct

    def _retire(self, retired: list[DirectPush]) -> list[tuple[str, dict[str, Any]]]:
        """Close the direct connections given up, each once Redis has answered every push written
        on it (`direct_timeout` seconds at most); returns the pushes Redis ran none of, to send.

        A write the kernel could not take (Redis slow to read for a moment) gives a connection up
        with pushes written whose commands Redis has not read yet. Closed at once, Redis would drop
        those (it drops a client it cannot answer, with what it has not read), and run the others
        after what the thread sends instead. Few writes fill a Unix socket (the embedded Redis:
        each takes a whole buffer of the socket's, about 170 pushes), many thousands a TCP one."""
        unsent: list[tuple[str, dict[str, Any]]] = []
        for direct in retired:
            try:
                if not direct.drain(time.monotonic() + self.direct_timeout):
                    logger.warning("job event publisher: %d push(es) unanswered on a connection given up",
                                   len(direct.unanswered))
            except Unsent as exc:  # refused, or the connection closed: as on the direct path
                unsent.extend(exc.pushes)
            except Exception:  # a broken connection: nothing more to read from it
                pass
            direct.close()
        return unsent

    def _send_batch(self, batch: list[tuple[str, dict[str, Any]]]) -> None:
        by_group: dict[str, list[dict[str, Any]]] = {}
        for group, message in batch:
            by_group.setdefault(group, []).append(message)
        group_members = getattr(self.layer, "group_members_now", None)  # taskplatform.channel_layer
        members = dict.fromkeys(by_group) if group_members is None else group_members(list(by_group))
        for group, found in members.items():
            for message in by_group[group]:
                try:
                    if found is None:
                        self._awaited(self.layer.group_send(group, message))
                    else:
                        self.layer.group_send_now(group, message, found)
                except Exception as exc:
                    logger.warning("job event publish to %s failed: %s: %s", group, type(exc).__name__, exc)

    def _awaited(self, coroutine: Any) -> Any:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)

    # -- from any thread -------------------------------------------------------------------
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every push has reached Redis (or failed); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._sending or self._retired:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._done.wait(remaining)
            direct = self._direct
            if direct is None:
                return True
            try:
                return direct.drain(deadline)
            except Unsent as exc:
                self._direct_lost(direct, exc)
                self._queue.extend(exc.pushes)
                self._work.notify()
        return self.flush(deadline - time.monotonic())  # what went back to the thread

    def _direct_lost(self, direct: DirectPush, exc: Unsent) -> None:
        """Under the lock: stop using `direct` (the thread closes it: `_retire`); the thread sends
        until it connects a new one."""
        self._direct = None
        self._retired.append(direct)
        self._work.notify()
        logger.warning("job event push failed, sending through the publisher's thread: %s", exc.reason)


_publisher: Publisher | None = None
_lock = threading.Lock()


def publisher() -> Publisher:
    """This process's publisher, started on first use (and again in a forked child)."""
    global _publisher
    current = _publisher
    if current is not None:  # a forked child starts without one (`_forget_after_fork`): no getpid per event
        return current
    with _lock:
        if _publisher is None or _publisher.pid != os.getpid():
            _publisher = Publisher()
        return _publisher


def _forget_after_fork() -> None:
    # The parent's loop thread does not exist in the child; the lock may be held by it.
    global _publisher, _lock
    _publisher = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def flush_pending(timeout: float = 2.0) -> None:
    """Give the sends still queued in this process up to `timeout` seconds to go out.

    Called when a process ends (at interpreter exit, and by Celery when it retires a pool
    process), so the last events of a short-lived command are pushed, not only written.
    """
    current = _publisher
    if current is not None and current.pid == os.getpid() and not current.flush(timeout):
        logger.warning("job event publisher: sends still pending at exit were dropped")


atexit.register(flush_pending)


def publish(group: str, message: Mapping[str, Any]) -> None:
    """Send `message` to `group` through the channel layer, fire-and-forget.

    Never raises and never blocks: a failure is logged, and the event log remains the truth.
    """
    publish_all([(group, message)])


def publish_all(pushes: list[tuple[str, Mapping[str, Any]]]) -> None:
    """`publish` each (group, message), in order: on the direct path, one write for them all."""
    if not pushes:
        return
    try:
        # The group rides along: a server process fans a message out to its local followers by it.
        publisher().send_all([(group, {**message, "group": group}) for group, message in pushes])
    except Exception:  # the write already happened; a lost push must not undo or fail it
        logger.exception("could not queue job events for %s", ", ".join(group for group, _ in pushes))


def event_publish(*, job: Job, event: JobEvent) -> None:
    """Push a committed event: to the job's group, and a `status` event's job to the feed; to
    each only if someone follows it, as the statement that wrote the event found
    (`jobs.followed`; a job read otherwise is taken as followed by both).

    Call it only after the event's transaction committed (`jobs.events.event_record` does so
    with `transaction.on_commit`), so no client ever sees an event that was rolled back.
    """
    publish_all(_event_pushes(job, event))


def events_publish(written: list[tuple[Job, JobEvent]]) -> None:
    """`event_publish` each committed (job, event), in order, together: a batch's first events
    (`manage.py submit --count`) go out in a few writes (`DirectPush.max_pushes` pushes each),
    not one per job."""
    publish_all([push for job, event in written for push in _event_pushes(job, event)])


def _event_pushes(job: Job, event: JobEvent) -> list[tuple[str, dict[str, Any]]]:
    # The data only: a web process that has followers encodes their frame once for all of them
    # (`jobs.fanout.Push`). Most events are followed by nobody: then nothing is built at all.
    job_followed, feed_followed = getattr(job, "_followed", EVERYONE)
    pushes = []
    if job_followed:
        pushes.append((job_group(job.pk), {"type": "job.event", "job_id": str(job.pk), "event": event.as_dict()}))
    if feed_followed and event.type == JobEvent.Type.STATUS:
        pushes.append((FEED_GROUP, {"type": "job.status", "job": job_as_dict(job), "owner_id": job.owner_id}))
    return pushes
