"""Fan-out of pushed job events inside one server process.

Channels' usual way gives every websocket its own channel and has channels-redis copy each
group message into each member's channel: with 1,000 sockets following jobs, every event wakes
that many receivers, each paying the channel layer's receive machinery (about 0.1 ms of CPU per
socket per event, measured by `bench/progress.py`). Here a server process joins each group
once, through ONE channel of its own, receives each message once, and hands it to the local
followers in one synchronous loop: no task, no await per follower. The message comes wrapped in
a `Push`, which builds each encoding the followers need (the websocket frame, the SSE frame)
once for all of them. With N web processes, each has its own fan-out and its own share of the
sockets; the channel layer delivers every message once to each process that follows the group.

A follower is anything with a non-blocking `deliver(push)` (the websocket consumers, the SSE
streams, the registry of live streams). `follow` returns only once the process is a member of
the group, so a caller that follows first and reads the database second misses nothing (the
consumers' "join first"): nothing is pushed to a group nobody marked followed, so `follow` also
marks it (`jobs.followed`), after the join. Memberships and marks are renewed every
`renew_interval` (a Redis that restarted empty forgets them; the periodic check of
`jobs.streams` covers the pushes lost meanwhile) and dropped once nobody here follows.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from dbkit.threads import off_request_thread
from jobs.followed import group_is_marked, groups_followed_mark

logger = logging.getLogger(__name__)


_groups_followed_mark = off_request_thread(groups_followed_mark)


class Push:
    """One message from the channel layer, as every follower in this process sees it.

    `encoded(name, make)` returns `make(message)`, computed by the first follower that asks and
    shared with the others: an event is serialised once per process, not once per socket.
    """

    __slots__ = ("message", "_encoded")

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self._encoded: dict[str, Any] = {}

    def encoded(self, name: str, make: Callable[[dict[str, Any]], Any]) -> Any:
        try:
            return self._encoded[name]
        except KeyError:
            value = self._encoded[name] = make(self.message)
            return value


class Batch:
    """Pushes of one group that reached this process together (a burst: a step's end, its
    progress and the next step's start come within milliseconds), in order. A follower with a
    `deliver_batch` takes them at once: one write per socket for the lot, not one per event.
    `encoded` as for `Push`, over the whole list."""

    __slots__ = ("pushes", "_encoded")

    def __init__(self, pushes: list[Push]) -> None:
        self.pushes = pushes
        self._encoded: dict[str, Any] = {}

    def encoded(self, name: str, make: Callable[[list[Push]], Any]) -> Any:
        try:
            return self._encoded[name]
        except KeyError:
            value = self._encoded[name] = make(self.pushes)
            return value


class Follower(Protocol):
    def deliver(self, push: Push) -> None:
        """Take one pushed message; must not block (write without awaiting, queue it, or set an
        event) and must not raise. (A follower may also have `deliver_batch(batch)`.)"""


def _not_cancelled() -> None:
    """Raise the cancellation of the running task if an await swallowed it: on Python 3.11,
    `asyncio.wait_for` (which redis-py wraps around each socket write) returns the result of a
    command that completed just as the task was cancelled, and the request is lost but still
    counted (`Task.cancelling`). Without this, a loop shutting down could wait for the receive
    loop forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class LocalFanout:
    """One channel and one receive loop per event loop, shared by every follower on it.

    A job's events come in bursts: a step's end, its progress and the next step's start, a few
    milliseconds apart. Handed out one by one to a crowd, the second and third wait for the whole
    pass of the first (8–28 µs per follower, by the machine's load: 4–14 ms for 500) and then
    take a pass of their own. So before it hands the first message after a quiet spell to a
    crowd, the loop waits for the rest of the burst, and hands everything out in one pass
    (`Batch`: one write per socket). It waits half the pass it is about to make, at most
    `LIVE_BURST_WINDOW_MS`: the first event is then later by at most half of what the second
    would have waited for. A pause under `min_pause` would end before a burst's next event
    comes, so a group with few followers never waits.
    """

    renew_interval = 30.0  # seconds between renewals of this process's group memberships
    # The shortest pause worth making: the events of a burst come 1-3 ms apart (bench/README.md).
    min_pause = 1e-3
    # What handing one message to one follower costs, in seconds: measured on this process's own
    # large passes (`_hand_out`), starting from what bench/progress.py measured.
    per_follower = 10e-6
    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self.followers: defaultdict[str, set[Follower]] = defaultdict(set)
        self.joined: dict[str, float] = {}  # group -> time.monotonic() of its last group_add
        self.marking: dict[str, asyncio.Future] = {}  # group -> its mark on the way
        self.lock = asyncio.Lock()  # joins and leaves, one at a time
        self.tasks: list[asyncio.Task] = []

    @classmethod
    def here(cls) -> LocalFanout:
        """The fan-out of the running event loop (one per server process)."""
        loop = asyncio.get_running_loop()
        fanout = cls._by_loop.get(loop)
        if fanout is None:
            fanout = cls._by_loop[loop] = cls()
        return fanout

    async def follow(self, group: str, follower: Follower) -> None:
        """Deliver the messages of `group` to `follower`; returns once this process is a member
        and the group is marked followed (`jobs.followed`: pushed to at all)."""
        self.followers[group].add(follower)
        if group not in self.joined:  # a leave checks for followers under the lock: it will not drop this one
            async with self.lock:
                if self.channel is None:
                    self.channel = await self.layer.new_channel(prefix="fanout")
                    self.tasks = [asyncio.ensure_future(self._receive_forever()),
                                  asyncio.ensure_future(self._renew_forever())]
                if group not in self.joined:
                    await self.layer.group_add(group, self.channel)
                    self.joined[group] = time.monotonic()
        if group_is_marked(group):
            # After the join: a move that finds the mark pushes to a member already. Each time,
            # not once per process: the statement finds a mark already there and writes nothing,
            # and a mark the database lost (a restore, a table emptied) is written again.
            await self._mark_once(group)

    async def _mark_once(self, group: str) -> None:
        """Mark `group`, or wait for its mark already on the way: a crowd that connects to one
        job at once sends a statement or a few, not one each. Outside the lock, so that the
        marks of different jobs do not wait for each other; shielded, so that a stream closed
        meanwhile does not stop the mark the others wait for."""
        marking = self.marking.get(group)
        if marking is None:
            marking = self.marking[group] = asyncio.ensure_future(self._mark([group], wait=True))
            marking.add_done_callback(lambda _: self.marking.pop(group, None))
        await asyncio.shield(marking)

    async def _mark(self, groups: list[str], *, wait: bool) -> None:
        """Mark `groups` followed in the database; a failure is logged (the streams' periodic
        check then reads what was not pushed)."""
        try:
            await _groups_followed_mark(groups, wait=wait)
        except Exception as exc:
            logger.warning("could not mark %d group(s) followed: %s: %s", len(groups), type(exc).__name__, exc)

    def unfollow(self, group: str, follower: Follower) -> None:
        """Stop delivering `group` to `follower` (the membership is dropped at the next renewal)."""
        followers = self.followers.get(group)
        if followers is not None:
            followers.discard(follower)
            if not followers:
                del self.followers[group]

    async def _receive_forever(self) -> None:
        while True:
            try:
                messages = [await self._receive_one()]
                pause = self._burst_pause(messages)
                if pause:
                    await asyncio.sleep(pause)
                    messages += await self._rest_of_burst()
                while messages:
                    _not_cancelled()
                    self._hand_out(messages)
                    # What came meanwhile (the rest of a burst, while the loop above wrote),
                    # taken at once and handed out together.
                    messages = await self._waiting()
                _not_cancelled()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: pushes are lost meanwhile, the database is not
                logger.warning("job event fan-out cannot receive: %s: %s", type(exc).__name__, exc)
                await asyncio.sleep(1)

    async def _waiting(self) -> list[dict[str, Any]]:
        receive_waiting = getattr(self.layer, "receive_waiting", None)  # taskplatform.channel_layer
        return await receive_waiting(self.channel) if receive_waiting is not None else []

    async def _rest_of_burst(self) -> list[dict[str, Any]]:
        """What came during the pause; nothing when Redis fails now: the message in hand still
        goes out (the next receive meets the failure and reports it)."""
        try:
            return await self._waiting()
        except asyncio.CancelledError:
            raise
        except Exception:
            return []

    def _burst_pause(self, messages: list[dict[str, Any]]) -> float:
        """Seconds to wait for the rest of a burst before handing `messages` out: half the pass
        they are about to take, at most the window; none under `min_pause` (see the class)."""
        window = settings.LIVE_BURST_WINDOW_MS / 1000
        if window <= 0:
            return 0.0
        crowd = sum(len(self.followers.get(group, ())) for group in {m.get("group", "") for m in messages})
        pause = min(window, crowd * self.per_follower / 2)
        return pause if pause >= self.min_pause else 0.0

    def _hand_out(self, messages: list[dict[str, Any]]) -> None:
        """Give each group's messages to its followers, in order, synchronously."""
        by_group: dict[str, list[Push]] = {}
        for message in messages:
            by_group.setdefault(message.get("group", ""), []).append(Push(message))
        for group, pushes in by_group.items():
            followers = self.followers.get(group)
            if not followers:
                continue
            started = time.perf_counter()
            batch = Batch(pushes) if len(pushes) > 1 else None
            for follower in tuple(followers):
                try:
                    if batch is not None and hasattr(follower, "deliver_batch"):
                        follower.deliver_batch(batch)
                    else:
                        for push in pushes:
                            follower.deliver(push)
                except Exception:
                    logger.exception("a follower of %s failed to take a message", group)
            if len(followers) >= 100:  # a pass long enough to time
                self.per_follower = 0.8 * self.per_follower + 0.2 * (time.perf_counter() - started) / len(followers)

    async def _receive_one(self) -> dict[str, Any]:
        """`layer.receive_unbacked` (one round trip; `receive` elsewhere), in a task of its own
        that is cancelled until it really stops.

        On Python 3.11, `asyncio.wait_for` (which redis-py wraps around each socket write)
        swallows a cancellation that arrives just as the write completes; channels-redis then
        goes on blocking-popping every 5 s, and a loop shutting down waits for it forever.
        """
        receive = getattr(self.layer, "receive_unbacked", self.layer.receive)  # taskplatform.channel_layer
        receiving = asyncio.ensure_future(receive(self.channel))
        try:
            await asyncio.wait([receiving])  # a cancellation lands here, not inside channels-redis
        except asyncio.CancelledError:
            while not receiving.done():
                receiving.cancel()
                try:
                    await asyncio.wait([receiving], timeout=0.05)
                except asyncio.CancelledError:
                    # Cancelled again meanwhile (a loop shutting down cancels every task once
                    # more): go on until the receive has stopped, or it outlives this task and
                    # the loop's shutdown waits for it forever.
                    pass
            raise
        return receiving.result()

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.renew_interval)
            await self.renew()

    async def renew(self) -> None:
        """Join again every group still followed here, leave the others, and mark the followed
        ones again (`jobs.followed`: one or two statements for them all)."""
        for group in list(self.joined):
            try:
                async with self.lock:
                    if group not in self.joined:
                        continue
                    if self.followers.get(group):
                        await self.layer.group_add(group, self.channel)
                        self.joined[group] = time.monotonic()
                    else:
                        del self.joined[group]
                        await self.layer.group_discard(group, self.channel)
            except Exception as exc:  # try again at the next renewal
                logger.warning("could not renew membership of %s: %s: %s", group, type(exc).__name__, exc)
        marked = [group for group in self.joined if group_is_marked(group)]
        if marked:
            await self._mark(marked, wait=False)
