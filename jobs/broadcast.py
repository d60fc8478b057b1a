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
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

from jobs.models import Job, JobEvent
from jobs.presenters import job_as_dict

logger = logging.getLogger(__name__)

FEED_GROUP = "jobs"
# Sends waiting in one process beyond this are dropped (and logged): with Redis down, memory
# must not grow without bound. The log stays complete; clients catch up from the database.
MAX_PENDING = 10_000
# Messages taken from the queue at once: one round trip asks which of their groups anyone follows.
BATCH = 500


def job_group(job_id: Any) -> str:
    """The channel group of one job's event stream: `job.<uuid hex>`."""
    hex_id = job_id.hex if hasattr(job_id, "hex") else str(job_id).replace("-", "")
    return f"job.{hex_id}"


class Publisher:
    """One daemon thread and one channel layer, for one process.

    Sends are queued and taken by the thread in batches: a batch asks Redis once which of its
    groups anyone follows, and who (`group_members_now`, one script per Redis host), and sends
    only to those, each message one more round trip (`group_send_now` with the members it was
    given). Most pushes go to a job nobody watches at that moment, and the feed when no page is
    open: they then cost a share of one round trip. Messages keep their order within a group.

    The thread uses plain blocking sockets (the layer's `…_now` methods): with an asyncio loop
    and redis-py's asyncio client, the loop's wake-ups and the client's machinery cost a pool
    process about half as much CPU as the job's own work (bench/README.md, "Prepared
    statements"). A channel layer without those methods gets its own `group_send`, awaited on a
    loop of this thread.
    """

    def __init__(self, alias: str = DEFAULT_CHANNEL_LAYER) -> None:
        self.pid = os.getpid()
        self.layer = channel_layers.make_backend(alias)
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()  # appended by any thread
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the thread waits on it for sends
        self._done = threading.Condition(self._lock)  # `flush` waits on it for the thread
        self._sending = False  # the thread holds a batch (under the lock)
        self._loop: asyncio.AbstractEventLoop | None = None  # only for another channel layer
        self._thread = threading.Thread(target=self._run, name="job-event-publisher", daemon=True)
        self._thread.start()

    def send(self, group: str, message: dict[str, Any]) -> None:
        """Queue `message` for `group` and return at once (thread-safe)."""
        if len(self._queue) >= MAX_PENDING:
            logger.warning("job event publisher: %d sends pending, dropped one for %s", len(self._queue), group)
            return
        with self._lock:
            self._queue.append((group, message))
            self._work.notify()  # wakes the thread if it waits; nothing to do while it sends

    # -- on the publisher's thread -----------------------------------------------------------
    def _run(self) -> None:
        self._warm()
        while True:
            with self._lock:
                while not self._queue:
                    self._sending = False
                    self._done.notify_all()
                    self._work.wait()
                self._sending = True
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
            try:
                self._send_batch(batch)
            except Exception as exc:  # a lost push costs a client a database read, never an event
                logger.warning("job event publish of %d message(s) failed: %s: %s", len(batch), type(exc).__name__,
                               exc)

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
        """Wait until every queued send has gone out (or failed); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._sending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._done.wait(remaining)
        return True


_publisher: Publisher | None = None
_lock = threading.Lock()


def publisher() -> Publisher:
    """This process's publisher, started on first use (and again in a forked child)."""
    global _publisher
    current = _publisher
    if current is not None and current.pid == os.getpid():
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
    try:
        # The group rides along: a server process fans a message out to its local followers by it.
        publisher().send(group, {**message, "group": group})
    except Exception:  # the write already happened; a lost push must not undo or fail it
        logger.exception("could not queue a job event for %s", group)


def event_publish(*, job: Job, event: JobEvent) -> None:
    """Push a committed event: to the job's group, and a `status` event's job to the feed.

    Call it only after the event's transaction committed (`jobs.events.event_record` does so
    with `transaction.on_commit`), so no client ever sees an event that was rolled back.
    """
    # The data only: a web process that has followers encodes their frame once for all of them
    # (`jobs.fanout.Push`). Most events are followed by nobody, and a pool process running a job
    # would otherwise encode each one for nothing (and send it twice over Redis).
    publish(job_group(job.pk), {"type": "job.event", "job_id": str(job.pk), "event": event.as_dict()})
    if event.type == JobEvent.Type.STATUS:
        publish(FEED_GROUP, {"type": "job.status", "job": job_as_dict(job), "owner_id": job.owner_id})
