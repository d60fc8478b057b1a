"""Push committed job events to websocket clients through the channel layer.

The durable event log (`jobs.events`) is the truth; this is only the fast path on top of it. A
push that is lost (Redis restarting, a client's channel over capacity) costs a client a database
read, never an event: consumers fill any gap in `seq` from the database.

Every process (a Celery worker child, the ASGI server, a management command) publishes through
ONE event loop running in a daemon thread and ONE channel layer with its own Redis connection
pool, created on first use. `async_to_sync(layer.group_send)` per event would build a new loop
and a new Redis connection each time (slow, and it leaks connections: channels_redis #100,
#125, #332). After a fork (Celery's prefork children) the child starts its own on first use.

`publish` only hands the message to that loop and returns at once, so it never blocks the
caller, sync or async. Messages to one group are sent in the order they were published (one
chain per group); different groups go out concurrently.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

from jobs.models import Job, JobEvent
from jobs.presenters import job_as_dict

logger = logging.getLogger(__name__)

FEED_GROUP = "jobs"
# Sends waiting in one process beyond this are dropped (and logged): with Redis down, memory
# must not grow without bound. The log stays complete; clients catch up from the database.
MAX_PENDING = 10_000


def job_group(job_id: Any) -> str:
    """The channel group of one job's event stream: `job.<uuid hex>`."""
    hex_id = job_id.hex if hasattr(job_id, "hex") else str(job_id).replace("-", "")
    return f"job.{hex_id}"


class Publisher:
    """One asyncio loop in a daemon thread and one channel layer, for one process."""

    def __init__(self, alias: str = DEFAULT_CHANNEL_LAYER) -> None:
        self.pid = os.getpid()
        self.layer = channel_layers.make_backend(alias)
        self.loop = asyncio.new_event_loop()
        self.pending = 0  # sends queued or in flight; only touched on the loop
        self._tails: dict[str, asyncio.Future] = {}  # the last send of each group
        self._thread = threading.Thread(target=self._run, name="job-event-publisher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def send(self, group: str, message: dict[str, Any]) -> None:
        """Queue `message` for `group` and return at once (thread-safe)."""
        self.loop.call_soon_threadsafe(self._enqueue, group, message)

    # -- on the publisher's loop -------------------------------------------------------------
    def _enqueue(self, group: str, message: dict[str, Any]) -> None:
        if self.pending >= MAX_PENDING:
            logger.warning("job event publisher: %d sends pending, dropped one for %s", self.pending, group)
            return
        self.pending += 1
        task = self.loop.create_task(self._send_after(self._tails.get(group), group, message))
        self._tails[group] = task
        task.add_done_callback(lambda done: self._finished(group, done))

    async def _send_after(self, previous: asyncio.Future | None, group: str, message: dict[str, Any]) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # keep the group's order; its failure is not ours
        await self.layer.group_send(group, message)

    def _finished(self, group: str, task: asyncio.Task) -> None:
        self.pending -= 1
        if self._tails.get(group) is task:
            del self._tails[group]
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.warning("job event publish to %s failed: %s: %s", group, type(exc).__name__, exc)

    async def _drain(self) -> None:
        while self._tails:
            await asyncio.wait(list(self._tails.values()))

    # -- from any thread -------------------------------------------------------------------
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued send has gone out (or failed); False on timeout."""
        future: Future = asyncio.run_coroutine_threadsafe(self._drain(), self.loop)
        try:
            future.result(timeout)
        except TimeoutError:
            return False
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
    # `frame` is what a websocket client gets, encoded here once rather than once per client.
    data = event.as_dict()
    publish(job_group(job.pk), {"type": "job.event", "job_id": str(job.pk), "event": data,
                                "frame": json.dumps({"type": "event", "event": data})})
    if event.type == JobEvent.Type.STATUS:
        summary = job_as_dict(job)
        publish(FEED_GROUP, {"type": "job.status", "job": summary, "owner_id": job.owner_id,
                             "frame": json.dumps({"type": "job", "job": summary})})
