"""A burst of a job's events reaches a crowd of followers in one pass (jobs.fanout.LocalFanout),
through the real channel layer on Redis; a handful of followers never waits for it."""

from __future__ import annotations

import asyncio
import types
import uuid

import pytest
from channels.layers import get_channel_layer

from jobs.fanout import LocalFanout


class Watcher:
    """A follower that notes how its messages came: one by one, or together."""

    def __init__(self) -> None:
        self.arrivals: list[list[int]] = []

    def deliver(self, push) -> None:
        self.arrivals.append([push.message["n"]])

    def deliver_batch(self, batch) -> None:
        self.arrivals.append([push.message["n"] for push in batch.pushes])


async def _burst_to(watchers: int, spacing: float = 0.0005) -> list[list[int]]:
    """`watchers` followers of a new group; three messages `spacing` apart after a quiet spell;
    how the first follower got them."""
    fanout, layer, group = LocalFanout(), get_channel_layer(), f"bursts-{uuid.uuid4().hex}"
    crowd = [Watcher() for _ in range(watchers)]
    try:
        for watcher in crowd:
            await fanout.follow(group, watcher)
        for n in range(3):
            await layer.group_send(group, {"type": "job.event", "group": group, "n": n})  # as jobs.broadcast sends
            await asyncio.sleep(spacing)
        for _ in range(200):
            if sum(len(arrival) for arrival in crowd[0].arrivals) == 3:
                break
            await asyncio.sleep(0.01)
        assert all(watcher.arrivals == crowd[0].arrivals for watcher in crowd)
        return crowd[0].arrivals
    finally:
        for task in fanout.tasks:
            task.cancel()
        await asyncio.gather(*fanout.tasks, return_exceptions=True)
        await layer.group_discard(group, fanout.channel)


@pytest.fixture
def large_passes(monkeypatch, settings):
    """A window wide enough for a loaded machine (50 ms), and a pass over 200 followers that
    counts as 100 ms long, so the whole window is worth waiting; half of three followers' pass
    (0.75 ms) is under the shortest pause worth making."""
    settings.LIVE_BURST_WINDOW_MS = 50.0
    monkeypatch.setattr(LocalFanout, "per_follower", 5e-4)


@pytest.mark.parametrize(("followers", "per_follower", "pause_ms"), [
    (500, 8e-6, 2.0),  # a quiet machine: half the 4 ms pass
    (500, 28e-6, 5.0),  # a loaded one: the 14 ms pass would take more than the window
    (1000, 8e-6, 4.0),
    (100, 8e-6, 0.0),  # half a 0.8 ms pass is no pause worth making
    (1, 1e-3, 0.0),
])
def test_the_pause_is_half_the_pass_within_the_window(settings, followers, per_follower, pause_ms):
    settings.LIVE_BURST_WINDOW_MS = 5.0
    fanout = LocalFanout()
    fanout.per_follower = per_follower
    fanout.followers["job.x"] = {object() for _ in range(followers)}
    assert fanout._burst_pause([{"group": "job.x"}]) == pytest.approx(pause_ms / 1000)


def test_a_crowd_gets_a_burst_in_one_pass(large_passes):
    assert asyncio.run(_burst_to(200)) == [[0, 1, 2]]


def test_a_handful_of_followers_gets_the_first_event_at_once(large_passes):
    arrivals = asyncio.run(_burst_to(3))
    assert arrivals[0] == [0]  # not held back for the rest
    assert [n for arrival in arrivals for n in arrival] == [0, 1, 2]


def test_without_the_window_a_crowd_gets_the_first_event_alone(large_passes, settings):
    settings.LIVE_BURST_WINDOW_MS = 0
    arrivals = asyncio.run(_burst_to(200))
    assert arrivals[0] == [0]
    assert [n for arrival in arrivals for n in arrival] == [0, 1, 2]


def test_the_event_in_hand_goes_out_when_redis_fails_during_the_wait(large_passes, monkeypatch):
    waiting = LocalFanout._waiting
    failed = []

    async def failing_once(self):
        if not failed:
            failed.append(True)
            raise ConnectionError("Redis went away during the burst window")
        return await waiting(self)

    monkeypatch.setattr(LocalFanout, "_waiting", failing_once)
    arrivals = asyncio.run(_burst_to(200))
    assert failed and [n for arrival in arrivals for n in arrival] == [0, 1, 2]
    assert arrivals[0][0] == 0


def test_a_cancellation_an_await_swallowed_still_stops_the_receive_loop(monkeypatch):
    """On Python 3.11 `asyncio.wait_for` (inside redis-py) can return a completed command's result
    to a task just cancelled, losing the cancellation: the loop must still stop, or a server
    shutting down (and this suite's cleanup) waits for it forever."""

    async def scenario():
        entered = asyncio.Event()

        async def swallowing(self):
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return []  # as wait_for does when the command completed at that moment
            return []

        monkeypatch.setattr(LocalFanout, "_waiting", swallowing)
        fanout, layer, group = LocalFanout(), get_channel_layer(), f"swallowed-{uuid.uuid4().hex}"
        await fanout.follow(group, Watcher())
        try:
            await layer.group_send(group, {"type": "job.event", "group": group, "n": 0})
            await asyncio.wait_for(entered.wait(), 5)  # handed out; now in the await that swallows
            receive_loop = fanout.tasks[0]
            receive_loop.cancel()
            await asyncio.wait([receive_loop], timeout=5)
            return receive_loop.done() and receive_loop.cancelled()
        finally:
            for task in fanout.tasks:
                task.cancel()
            await asyncio.wait(fanout.tasks, timeout=5)
            await layer.group_discard(group, fanout.channel)

    assert asyncio.run(scenario())


def test_a_receive_that_swallows_a_cancellation_stops_though_its_loop_is_cancelled_twice():
    """A loop shutting down cancels every task once more: the receive loop, cancelled first by
    its server and then by the shutdown while it waits for the receive to stop, still sees the
    receive stop, or the shutdown waits for that receive forever."""

    async def swallowing(channel):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # lost, as wait_for loses it inside redis-py on Python 3.11
        await asyncio.sleep(30)  # and it goes on popping

    async def scenario():
        fanout = LocalFanout()
        fanout.layer = types.SimpleNamespace(receive_unbacked=swallowing, receive=swallowing)
        fanout.channel = "fanout!x"
        receiving = asyncio.ensure_future(fanout._receive_one())
        await asyncio.sleep(0.01)
        receiving.cancel()  # the server stops it
        await asyncio.sleep(0.01)  # now cancelling the receive, which swallowed that
        receiving.cancel()  # the loop's shutdown
        await asyncio.wait([receiving], timeout=5)
        await asyncio.sleep(0.1)
        left = [repr(task) for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        return receiving.done() and receiving.cancelled(), left

    cancelled, left = asyncio.run(scenario())
    assert cancelled and left == []
