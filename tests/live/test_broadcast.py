"""The per-process publisher: one loop thread and one channel layer, never blocking, after commit."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import threading
import time
import uuid
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from hypothesis import given
from hypothesis import strategies as st

from jobs import broadcast
from jobs.broadcast import publish, publisher
from jobs.events import event_append
from jobs.followed import FEED_GROUP, groups_followed_mark, job_group
from jobs.services import job_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.transitions.job_dispatch"):
        yield


def member_of(group: str) -> str:
    """A channel in `group`, made with the default layer, and the group marked followed (as a web
    process's fan-out does for its streams: `jobs.followed`)."""

    async def join():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        return channel

    channel = async_to_sync(join)()
    groups_followed_mark([group])
    return channel


def received(channel: str, count: int, timeout: float = 5) -> list[dict]:
    async def take():
        layer = get_channel_layer()
        return [await asyncio.wait_for(layer.receive(channel), timeout) for _ in range(count)]

    return async_to_sync(take)()


def publisher_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "job-event-publisher"]


@pytest.fixture
def thread_path():
    """This process's publisher without the direct path: every push goes through its thread."""
    previous = broadcast._publisher
    broadcast._publisher = broadcast.Publisher(direct=False)
    yield broadcast._publisher
    assert broadcast._publisher.flush(5)
    broadcast._publisher = previous


def direct_ready(timeout: float = 5.0) -> broadcast.DirectPush:
    """This process's publisher, once its thread has connected the direct path."""
    deadline = time.monotonic() + timeout
    while publisher()._direct is None:
        assert time.monotonic() < deadline, "the publisher did not connect its direct path"
        time.sleep(0.01)
    return publisher()._direct


def test_many_publishes_share_one_loop_thread_and_one_layer_and_keep_their_order():
    channel = member_of("bench.order")
    first = publisher()
    for number in range(200):
        publish("bench.order", {"type": "test.message", "number": number})
    assert publisher() is first and len(publisher_threads()) == 1
    assert first.flush(5)
    assert [message["number"] for message in received(channel, 200)] == list(range(200))
    # One plain client, no asyncio pools: the thread sends on blocking sockets.
    assert list(first.layer.sync_clients) == [0] and not first.layer._layers


def test_publish_returns_at_once_even_when_redis_is_slow(thread_path):
    member_of("bench.slow")
    slow_sends = []

    def slow_send(group, message, members):
        time.sleep(0.05)  # every send waits; the caller must not
        slow_sends.append(message)

    with mock.patch.object(publisher().layer, "group_send_now", slow_send):
        started = time.monotonic()
        for number in range(20):
            publish("bench.slow", {"type": "test.message", "number": number})
        assert time.monotonic() - started < 0.1
        assert publisher().flush(15)
    assert [message["number"] for message in slow_sends] == list(range(20))


def test_publish_does_not_block_an_event_loop():
    channel = member_of("bench.async")

    async def from_a_coroutine():
        started = time.monotonic()
        publish("bench.async", {"type": "test.message"})
        return time.monotonic() - started

    assert async_to_sync(from_a_coroutine)() < 0.05
    assert received(channel, 1)[0]["type"] == "test.message"


def test_a_failed_push_never_fails_the_write(caplog, thread_path):
    job, _ = job_submit(kind="demo.noop", input={})

    def broken(group, message, members):
        raise ConnectionError("redis is down")

    def broken_check(groups):
        raise ConnectionError("redis is down")

    groups_followed_mark([job_group(job.pk)])  # followed (pushed to), by no member yet
    with mock.patch.object(publisher().layer, "group_members_now", broken_check), caplog.at_level(logging.WARNING):
        event = event_append(job_id=job.pk, type="log", status="info", message={"text": "written, pushed nowhere"})
        assert publisher().flush(5)
    member_of(job_group(job.pk))
    with mock.patch.object(publisher().layer, "group_send_now", broken), caplog.at_level(logging.WARNING):
        event = event_append(job_id=job.pk, type="log", status="info", message={"text": "still written"})
        assert publisher().flush(5)
    assert event.seq == 3 and job.events.count() == 3
    assert "message(s) failed: ConnectionError: redis is down" in caplog.text  # the check
    assert f"publish to {job_group(job.pk)} failed: ConnectionError: redis is down" in caplog.text  # the send


def test_a_batch_asks_redis_once_which_groups_anyone_follows_and_sends_only_to_those(thread_path):
    channel = member_of("bench.followed")
    asked, sent = [], []
    layer = publisher().layer
    real_members, real_send = layer.group_members_now, layer.group_send_now

    def members(groups):
        if groups == ["bench.pause"]:
            time.sleep(0.2)  # the thread is busy: the sends below queue up
        else:
            asked.append(list(groups))
        return real_members(groups)

    def send(group, message, members):
        sent.append((group, members))
        real_send(group, message, members)

    with mock.patch.object(layer, "group_members_now", members), mock.patch.object(layer, "group_send_now", send):
        publish("bench.pause", {"type": "test.message"})
        time.sleep(0.05)  # the thread has taken it
        for number in range(300):
            publish(f"bench.nobody.{number}", {"type": "test.message"})
            publish("bench.followed", {"type": "test.message", "number": number})
        assert publisher().flush(10)
    assert len(asked) <= 2 and sum(len(groups) for groups in asked) == 301 + (len(asked) - 1)
    # Each send is given the members the batch read: it does not read them again.
    assert {(group, tuple(found)) for group, found in sent} == {("bench.followed", (channel,))}
    assert len(sent) == 300
    assert [message["number"] for message in received(channel, 300)] == list(range(300))


def test_events_go_to_the_job_group_and_status_changes_to_the_feed():
    job, _ = job_submit(kind="demo.noop", input={})
    assert publisher().flush(5)  # the submit's own pushes are out before anyone joins
    job_channel, feed_channel = member_of(job_group(job.pk)), member_of(FEED_GROUP)
    event_append(job_id=job.pk, type="log", status="info", message={"text": "hello"})
    from jobs.services import job_cancel

    job_cancel(job_id=job.pk)
    assert publisher().flush(5)
    pushed = received(job_channel, 2)
    assert [(m["type"], m["event"]["seq"], m["event"]["type"]) for m in pushed] == [
        ("job.event", 2, "log"), ("job.event", 3, "status")]
    (feed,) = received(feed_channel, 1)
    assert feed["type"] == "job.status" and feed["job"]["id"] == str(job.pk) and feed["job"]["status"] == "cancelled"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_publishes_through_its_own_loop():
    channel = member_of("bench.fork")
    parent = publisher()
    pid = os.fork()
    if pid == 0:  # the child, as a Celery prefork child would be
        code = 1
        try:
            child = publisher()
            publish("bench.fork", {"type": "test.message", "pid": os.getpid()})
            code = 0 if child is not parent and child.pid == os.getpid() and child.flush(5) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert received(channel, 1)[0]["pid"] == pid
    assert publisher() is parent and broadcast._publisher is parent


def test_a_short_lived_process_sends_its_last_events_before_it_exits():
    """`manage.py submit` and the like: the process ends right after the commit."""
    import subprocess
    import sys

    from tests.support.processes import BASE_DIR, child_env

    channel = member_of("bench.exit")
    script = (
        "import django; django.setup()\n"
        "from jobs.broadcast import publish\n"
        "for n in range(20): publish('bench.exit', {'type': 'test.message', 'n': n})\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=BASE_DIR, env=child_env(), check=True, timeout=60)
    assert [message["n"] for message in received(channel, 20)] == list(range(20))


async def two_process_channels_sent(layer, group: str, count: int) -> tuple[str, str]:
    """The fan-out's channel and another channel of this process, both in `group` (they share one
    Redis key), after `count` numbered group messages were sent to it."""
    ours, other = await layer.new_channel(prefix="fanout"), await layer.new_channel()
    await layer.group_add(group, ours)
    await layer.group_add(group, other)
    for number in range(count):
        await layer.group_send(group, {"type": "test.message", "number": number})
    return ours, other


def test_what_waits_for_a_process_channel_is_taken_at_once_in_order_and_shared_with_its_other_channels():
    """`receive_waiting` (the fan-out's way to take the rest of a burst): one group message for two
    channels of this process reaches both, and nothing is lost or reordered."""

    async def scenario():
        layer = get_channel_layer()
        ours, other = await two_process_channels_sent(layer, "bench.burst", 5)
        first = await asyncio.wait_for(layer.receive(ours), 5)
        rest = await layer.receive_waiting(ours)
        assert [m["number"] for m in [first, *rest]] == [0, 1, 2, 3, 4]
        assert await layer.receive_waiting(ours) == []
        theirs = [await asyncio.wait_for(layer.receive(other), 5) for _ in range(5)]
        assert [m["number"] for m in theirs] == [0, 1, 2, 3, 4]

    async_to_sync(scenario)()


def test_a_group_send_is_one_round_trip_with_its_members_and_keeps_channels_redis_semantics():
    """`taskplatform.channel_layer.RedisChannelLayer.group_send`: given the members, one pipeline;
    a member at its capacity is skipped, the others still get the message; a group nobody is in
    costs only the read of its members."""
    # Channels of their own keys (a process's `new_channel()`s share one key, and its capacity).
    full, open_ = f"bench.full.{uuid.uuid4().hex}", f"bench.open.{uuid.uuid4().hex}"

    async def scenario():
        layer = get_channel_layer()
        for channel in (full, open_):
            await layer.group_add("bench.capacity", channel)
        calls = []
        connection = layer.connection(0)
        real_pipeline = type(connection).pipeline

        def counted_pipeline(self, *args, **kwargs):
            pipe = real_pipeline(self, *args, **kwargs)
            real_execute = pipe.execute

            async def execute(*a, **k):
                calls.append(len(pipe.command_stack))
                return await real_execute(*a, **k)

            pipe.execute = execute
            return pipe

        real_evalsha = type(connection).evalsha

        async def counted_evalsha(self, *args, **kwargs):
            calls.append("script")
            return await real_evalsha(self, *args, **kwargs)

        with mock.patch.object(type(connection), "pipeline", counted_pipeline), \
                mock.patch.object(type(connection), "evalsha", counted_evalsha):
            members = await layer.group_members(["bench.capacity", "bench.nobody"])
            assert calls == ["script"], calls  # both groups in one round trip
            assert set(members) == {"bench.capacity"} and set(members["bench.capacity"]) == {full, open_}
            calls.clear()
            capacity = layer.get_capacity(full)
            for _ in range(capacity):  # `full` reaches its capacity; nobody reads it
                await layer.send(full, {"type": "test.message", "number": -1})
            await layer.group_send("bench.capacity", {"type": "test.message", "number": 1},
                                   members=members["bench.capacity"])
            assert len(calls) == 1, calls  # one round trip, members given
            await layer.group_send("bench.nobody", {"type": "test.message"})
            assert calls[1:] == ["script"], calls  # the read of nobody, and nothing sent
        return capacity

    capacity = async_to_sync(scenario)()
    assert [message["number"] for message in received(open_, 1)] == [1]
    assert [message["number"] for message in received(full, capacity)] == [-1] * capacity


def test_group_members_drops_expired_members_and_survives_a_redis_that_forgot_its_scripts():
    group = f"bench.expiry.{uuid.uuid4().hex}"

    async def scenario():
        layer = get_channel_layer()
        await layer.group_add(group, "bench.alive")
        connection = layer.connection(0)
        stale = int(time.time()) - layer.group_expiry - 10  # joined, and never renewed since
        await connection.zadd(layer._group_key(group), {"bench.gone": stale})
        await connection.script_flush()  # as after a restart: the script is not there
        first = await layer.group_members([group, "bench.nobody"])
        second = await layer.group_members([group])
        left = await connection.zrange(layer._group_key(group), 0, -1)
        return first, second, left

    first, second, left = async_to_sync(scenario)()
    assert first == second == {group: ["bench.alive"]}
    assert left == [b"bench.alive"]  # the expired member is gone from Redis too


def test_the_fan_out_takes_a_message_in_one_round_trip_and_leaves_the_others_theirs():
    """`receive_unbacked` (the fan-out's receive): one BZPOPMIN per message, where channels-redis'
    `receive` also restores, writes and deletes a backup copy (three more round trips before the
    message is handed out); a group message for two channels of this process reaches both."""

    async def scenario():
        layer = get_channel_layer()
        ours, other = await two_process_channels_sent(layer, "bench.unbacked", 3)
        sent = []
        connection_class = type(layer.connection(0))
        real_execute = connection_class.execute_command

        async def recorded(self, *args, **options):
            sent.append(str(args[0]).upper())
            return await real_execute(self, *args, **options)

        with mock.patch.object(connection_class, "execute_command", recorded):
            first = await asyncio.wait_for(layer.receive_unbacked(ours), 5)
        assert sent == ["BZPOPMIN"], sent
        rest = await layer.receive_waiting(ours)
        assert [m["number"] for m in [first, *rest]] == [0, 1, 2]
        theirs = [await asyncio.wait_for(layer.receive(other), 5) for _ in range(3)]
        assert [m["number"] for m in theirs] == [0, 1, 2]

    async_to_sync(scenario)()


# -- The direct path: pushes written by the thread that publishes them ------------------------------
def test_a_push_is_written_by_the_thread_that_publishes_it_not_handed_to_another():
    channel = member_of("bench.direct")
    publish("bench.warm", {"type": "test.message"})  # a Redis that lost the script (an earlier test) is seen
    assert publisher().flush(5)
    direct_ready()
    with mock.patch.object(broadcast.Publisher, "_send_batch", side_effect=AssertionError("handed to the thread")):
        for number in range(100):
            publish("bench.direct", {"type": "test.message", "number": number})
        assert publisher().flush(5)
    assert publisher()._direct is not None and not publisher()._direct.unanswered
    assert [message["number"] for message in received(channel, 100)] == list(range(100))


def fresh_layer(**config):
    """A channel layer of its own (its own prefix, so no key of another test), on the suite's Redis."""
    from taskplatform.channel_layer import RedisChannelLayer

    return RedisChannelLayer(hosts=get_channel_layer().hosts, prefix=f"bench{uuid.uuid4().hex[:8]}", **config)


def test_the_push_script_writes_what_channels_redis_group_send_writes():
    """The same members' keys, the same message (the channels sharing a key named in it), the same
    expiry: two channels of one process (one key), and a channel of a key of its own."""
    group_send, pushed = f"bench.semantics.a.{uuid.uuid4().hex}", f"bench.semantics.b.{uuid.uuid4().hex}"
    message = {"type": "test.message", "text": "é" * 40, "nested": {"empty": {}, "list": [1, 2.5, None, True]},
               "bytes": b"\x00\xff", "big": 2**40, **{f"k{n}": n for n in range(20)}}
    layer = fresh_layer()

    async def scenario():
        one, two = await layer.new_channel(), await layer.new_channel()
        alone = f"bench.alone.{uuid.uuid4().hex}"
        for group in (group_send, pushed):
            for channel in (one, two, alone):
                await layer.group_add(group, channel)
        await layer.group_send(group_send, message)
        direct = broadcast.DirectPush(layer, layer.push_connection(2.0))
        try:
            direct.send([(pushed, message)])
            assert direct.drain(time.monotonic() + 5)
        finally:
            direct.close()
        connection = layer.connection(0)
        stored = {}
        for key in (layer.prefix + layer.non_local_name(one), layer.prefix + alone):
            members = await connection.zrange(key, 0, -1, withscores=True)
            stored[key] = [(layer.deserialize(raw), score) for raw, score in members]
            assert 0 < await connection.ttl(key) <= layer.expiry
        taken = {channel: [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(2)]
                 for channel in (one, two, alone)}
        return one, two, alone, stored, taken

    one, two, alone, stored, taken = async_to_sync(scenario)()
    for key, ((by_group_send, first_score), (by_script, second_score)) in stored.items():
        assert by_script == by_group_send, key
        assert abs(second_score - first_score) < 5
    shared = stored[layer.prefix + layer.non_local_name(one)][1][0]
    assert sorted(shared["__asgi_channel__"]) == sorted([one, two])
    for messages in taken.values():
        assert messages[0] == messages[1] == message


def test_the_push_script_skips_a_full_key_and_says_so(caplog):
    layer = fresh_layer(capacity=2)
    full, open_ = f"bench.full.{uuid.uuid4().hex}", f"bench.open.{uuid.uuid4().hex}"
    group = "bench.pushed.capacity"
    direct = broadcast.DirectPush(layer, layer.push_connection(2.0))
    try:
        async def join():
            for channel in (full, open_):
                await layer.group_add(group, channel)
            await layer.send(full, {"type": "test.message", "number": -1})
            await layer.send(full, {"type": "test.message", "number": -2})

        async_to_sync(join)()
        with caplog.at_level(logging.INFO, logger="jobs.broadcast"):
            direct.send([(group, {"type": "test.message", "number": 1})])
            assert direct.drain(time.monotonic() + 5)
        assert "1 channel key(s) over capacity, skipped" in caplog.text

        async def take(channel, count):
            return [(await asyncio.wait_for(layer.receive(channel), 5))["number"] for _ in range(count)]

        assert async_to_sync(take)(open_, 1) == [1]
        assert async_to_sync(take)(full, 2) == [-1, -2]
    finally:
        direct.close()


def client_id(direct: broadcast.DirectPush) -> int:
    """The id Redis knows the direct path's connection by, asked on it while nothing else is
    written on it or waits for an answer (a Unix socket, the embedded Redis's, has no address of
    its own to name it by)."""
    with publisher()._lock:
        assert direct.drain(time.monotonic() + 5)
        direct.socket.settimeout(5)
        try:
            direct.connection.send_command("CLIENT", "ID")
            return direct.connection.read_response()
        finally:
            direct.socket.setblocking(False)


def test_a_connection_redis_closed_goes_back_to_the_thread_and_loses_nothing(caplog):
    import redis as redis_py
    from django.conf import settings

    channel = member_of("bench.killed")
    direct = direct_ready()
    killer = redis_py.Redis.from_url(settings.REDIS_URL)
    assert killer.client_kill_filter(_id=client_id(direct)) == 1  # as Redis does at a restart
    time.sleep(0.1)  # its close has reached this side
    with caplog.at_level(logging.WARNING, logger="jobs.broadcast"):
        for number in range(20):
            publish("bench.killed", {"type": "test.message", "number": number})
        assert publisher().flush(5)
    assert "sending through the publisher's thread: OSError: Redis closed the connection" in caplog.text
    assert [message["number"] for message in received(channel, 20)] == list(range(20))
    assert direct_ready() is not direct  # the thread connected a new one
    publish("bench.killed", {"type": "test.message", "number": 20})
    assert [message["number"] for message in received(channel, 1)] == [20]


def test_a_connection_given_up_while_redis_is_slow_is_closed_once_redis_ran_what_it_was_written(tmp_path, settings,
                                                                                                  caplog):
    """A Unix socket (the embedded Redis) takes about 170 small writes Redis has not read yet: a
    burst while Redis stalls fills it, and the direct path gives the connection up. Closed at once,
    Redis dropped the pushes it had not read; its thread closes it once Redis answered them all,
    then sends the rest: none lost, none twice, in order."""
    import signal

    from tests.chaos.servers import PrivateRedis

    socket_path = tmp_path / "redis.sock"
    stalled = PrivateRedis(tmp_path, extra=["--unixsocket", str(socket_path)]).start()
    settings.CHANNEL_LAYERS = {**settings.CHANNEL_LAYERS, "stalled": {
        "BACKEND": "taskplatform.channel_layer.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": f"unix://{socket_path}"}], "prefix": "stalled", "capacity": 1000},
    }}
    slow = None
    try:
        layer = broadcast.channel_layers.make_backend("stalled")

        async def join():
            channel = await layer.new_channel()
            await layer.group_add("bench.stalled", channel)
            return channel

        channel = async_to_sync(join)()
        slow = broadcast.Publisher("stalled")
        assert slow.flush(5)
        deadline = time.monotonic() + 5
        while slow._direct is None:
            assert time.monotonic() < deadline, "the publisher did not connect its direct path"
            time.sleep(0.01)
        stalled.proc.send_signal(signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="jobs.broadcast"):
                for number in range(500):
                    slow.send("bench.stalled", {"type": "test.message", "number": number, "group": "bench.stalled"})
        finally:
            stalled.proc.send_signal(signal.SIGCONT)
        assert "sending through the publisher's thread: BlockingIOError" in caplog.text
        assert slow.flush(10)

        async def take():
            return [(await asyncio.wait_for(layer.receive(channel), 5))["number"] for _ in range(500)]

        assert async_to_sync(take)() == list(range(500))
    finally:
        if slow is not None:
            slow._direct_wanted = False  # its thread stops connecting to the server stopped below
        stalled.stop()


def test_a_redis_that_forgot_the_push_script_gets_it_again_and_loses_no_push(caplog):
    """`SCRIPT FLUSH`: the pushes Redis refused (it ran none of them) go through the thread, in
    order, and the thread connects a new direct path, which loads the script."""
    import redis as redis_py
    from django.conf import settings

    channel = member_of("bench.noscript")
    direct = direct_ready()
    redis_py.Redis.from_url(settings.REDIS_URL).script_flush()
    with caplog.at_level(logging.WARNING, logger="jobs.broadcast"):
        for number in range(5):
            publish("bench.noscript", {"type": "test.message", "number": number})
        assert publisher().flush(5)
    assert "sending through the publisher's thread: Redis ran none of" in caplog.text
    assert "NOSCRIPT" in caplog.text
    assert direct_ready() is not direct
    publish("bench.noscript", {"type": "test.message", "number": 5})
    assert [message["number"] for message in received(channel, 6)] == list(range(6))


class _AnswersLate:
    """The direct path's socket to the real Redis, with the network's timing held: no answer has
    come until `arrive()`, and then one comes per read (as separate packets would)."""

    def __init__(self, real) -> None:
        self.real, self.arrived = real, False

    def arrive(self) -> None:
        self.arrived = True

    def recv(self, size: int) -> bytes:
        if not self.arrived:
            raise BlockingIOError
        waiting = self.real.recv(size, socket.MSG_PEEK)
        return self.real.recv(min(size, waiting.index(b"\r\n") + 2))

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def test_pushes_written_after_a_refused_one_go_again_with_it():
    """Redis refused the first of two pushes already written (`SCRIPT FLUSH`) and the second's
    answer has not come: both go another way, in order, with the push at hand; none is left
    behind on the connection being given up."""
    import redis as redis_py
    from django.conf import settings

    layer = broadcast.channel_layers.make_backend(broadcast.DEFAULT_CHANNEL_LAYER)
    direct = broadcast.DirectPush(layer, layer.push_connection(2.0))
    try:
        pushes = [("bench.late", {"type": "test.message", "number": number}) for number in range(3)]
        direct.send([pushes[0]])  # a push that runs, answered: Redis has the script
        assert direct.drain(time.monotonic() + 5)
        redis_py.Redis.from_url(settings.REDIS_URL).script_flush()
        direct.socket = _AnswersLate(direct.socket)
        direct.send([pushes[1]])
        direct.send([pushes[2]])
        direct.socket.arrive()
        select.select([direct.socket.real], [], [], 5)
        with pytest.raises(broadcast.Unsent) as refused:
            direct.send([("bench.late", {"type": "test.message", "number": 3})])
        assert [message["number"] for _, message in refused.value.pushes] == [1, 2, 3]
        assert "Redis ran none of 1 push(es) (and 1 written after, unanswered yet): NOSCRIPT" in str(refused.value)
        assert not direct.unanswered
    finally:
        direct.close()


def test_a_publisher_sends_through_its_thread_until_the_direct_path_is_connected():
    """At a process's start, or with Redis away: nothing waits for the connection."""
    channel = member_of("bench.early")
    from taskplatform.channel_layer import RedisChannelLayer

    with mock.patch.object(RedisChannelLayer, "push_connection", side_effect=ConnectionError("away")):
        early = broadcast.Publisher()
        for number in range(10):
            early.send("bench.early", {"type": "test.message", "number": number, "group": "bench.early"})
        assert early.flush(5) and early._direct is None
    assert [message["number"] for message in received(channel, 10)] == list(range(10))


def test_a_redis_that_became_a_replica_refuses_the_pushes_and_they_go_another_way(tmp_path):
    """A failover the connection outlived: the old master, a replica now, answers READONLY to the
    script, having run none of it. Those pushes come back to the publisher (`Unsent`) rather than
    being dropped, and the connection is given up (a new one asks the Sentinels for the master)."""
    from taskplatform.channel_layer import RedisChannelLayer
    from tests.chaos.servers import PrivateRedis

    master, other = PrivateRedis(tmp_path / "a").start(), PrivateRedis(tmp_path / "b").start()
    try:
        layer = RedisChannelLayer(hosts=[{"address": master.url}], prefix="bench")
        direct = broadcast.DirectPush(layer, layer.push_connection(2.0))
        direct.send([("bench.replica", {"type": "test.message", "number": 0})])
        assert direct.drain(time.monotonic() + 5)
        import redis as redis_py

        redis_py.Redis.from_url(master.url).execute_command("REPLICAOF", "127.0.0.1", other.port)
        pushes = [("bench.replica", {"type": "test.message", "number": 1}),
                  ("bench.replica", {"type": "test.message", "number": 2})]
        direct.send(pushes[:1])
        time.sleep(0.2)  # its answer has come
        with pytest.raises(broadcast.Unsent) as refused:
            direct.send(pushes[1:])
        assert refused.value.pushes == pushes and "READONLY" in refused.value.reason
        direct.close()
    finally:
        master.stop()
        other.stop()


def test_a_large_push_goes_through_the_thread_and_keeps_the_connection():
    """A job's status on the feed carries its input and result: a push larger than a direct write
    takes (`DirectPush.max_write`) goes through the thread, in order, and the connection stays."""
    channel = member_of("bench.large")
    publish("bench.warm", {"type": "test.message"})
    assert publisher().flush(5)
    direct = direct_ready()
    publish("bench.large", {"type": "test.message", "number": 0})
    publish("bench.large", {"type": "test.message", "number": 1, "input": "x" * 200_000})
    publish("bench.large", {"type": "test.message", "number": 2})
    assert publisher().flush(5)
    pushed = received(channel, 3)
    assert [message["number"] for message in pushed] == [0, 1, 2] and len(pushed[1]["input"]) == 200_000
    assert publisher()._direct is direct


def test_many_pushes_at_once_are_written_directly_a_few_commands_in_order():
    """More pushes in one call than `DirectPush.max_pushes` (a batch's first events) are written
    directly as commands of at most that many, in order after what was published before them:
    none goes through the thread, and the connection stays."""
    channel = member_of("bench.many")
    publish("bench.warm", {"type": "test.message"})
    assert publisher().flush(5)
    direct = direct_ready()
    layer = direct.layer
    encoded = []
    real_command = layer.push_command

    def push_command(pushes):
        encoded.append(len(pushes))
        return real_command(pushes)

    count = direct.max_pushes + 10  # pushes to the followed group, each with one to a group nobody follows
    with mock.patch.object(layer, "push_command", push_command), \
            mock.patch.object(layer, "group_members_now", side_effect=AssertionError("the thread sent")):
        publish("bench.many", {"type": "test.message", "number": -1})
        broadcast.publish_all([(group, {"type": "test.message", "number": number})
                               for number in range(count) for group in ("bench.many", f"bench.nobody.{number}")])
        publish("bench.many", {"type": "test.message", "number": count})
        assert publisher().flush(5)
    assert encoded == [1, direct.max_pushes, direct.max_pushes, 2 * count - 2 * direct.max_pushes, 1]
    assert [message["number"] for message in received(channel, count + 2)] == list(range(-1, count + 1))
    assert publisher()._direct is direct


def test_a_batch_submit_publishes_its_first_events_at_once_and_each_reaches_the_feed():
    from django.db import connection

    from jobs.services import jobs_submit_many

    feed_channel = member_of(FEED_GROUP)
    publish("bench.warm", {"type": "test.message"})
    assert publisher().flush(5)
    with mock.patch.object(broadcast.Publisher, "send_all", autospec=True,
                           side_effect=broadcast.Publisher.send_all) as send_all:
        jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * 40)
        assert publisher().flush(5)
    groups = [group for group, _ in send_all.call_args.args[1]]
    assert send_all.call_count == 1 and groups.count(FEED_GROUP) == 40
    if connection.vendor == "postgresql":  # elsewhere nothing is marked and every event is pushed (jobs.followed)
        assert len(groups) == 40  # the feed only: nobody can follow a job's own group before it is committed
    feed = received(feed_channel, 40)
    assert [message["job"]["id"] for message in feed] == [str(job.pk) for job in jobs]
    assert {message["job"]["status"] for message in feed} == {"pending"}


def test_a_push_command_is_packed_as_redis_py_packs_it():
    """The direct path packs with hiredis itself; what it writes is what redis-py's packer writes,
    for each kind of argument a push command holds, and without hiredis redis-py's packer is used."""
    import redis
    from django.conf import settings
    from redis.connection import PythonRespSerializer

    connection = redis.Redis.from_url(settings.REDIS_URL).connection_pool.make_connection()
    command = ["EVALSHA", "abc123", 2, "asgi:group:jobs", b"asgi:group:job.\xff", 1733300000, -5, 86400.5,
               "asgi:", "1733300000.000001", b"\x00\x81msg\xc3", "é"]
    expected = b"".join(connection._command_packer.pack(*command))
    assert broadcast._packer(connection)(command) == expected
    connection._command_packer = PythonRespSerializer(connection._buffer_cutoff, connection.encoder.encode)
    assert broadcast._packer(connection)(command) == b"".join(connection._command_packer.pack(*command))
    connection.disconnect()


@given(st.integers(min_value=0, max_value=4_102_444_800_000_000))  # microseconds, to 2100
def test_a_push_score_is_its_microseconds_as_seconds_and_the_next_one_is_above_it(microseconds):
    """A score's text reads back (as Redis reads it, a double) as the time it stands for, and a
    score one microsecond later reads back higher: two pushes keep their order in a key."""
    from taskplatform.channel_layer import PUSH_SCORE_STEP_US, _score_text

    text = _score_text(microseconds)
    assert abs(float(text) - microseconds / 1e6) <= 1e-6 and float(text) == float(repr(microseconds / 1e6))
    assert float(_score_text(microseconds + PUSH_SCORE_STEP_US)) > float(text)


def test_answers_longer_than_one_read_are_all_taken_by_one_read(monkeypatch):
    """A read takes what is there with as few calls as it can: one when the answers fit, more
    while each call fills the size asked for."""
    publish("bench.warm", {"type": "test.message"})
    assert publisher().flush(5)
    direct = direct_ready()
    with publisher()._lock:
        monkeypatch.setattr(direct, "read_size", 5)  # each answer (`:0\r\n`) is 4 bytes
        for number in range(6):
            direct.send([("bench.read", {"type": "test.message", "number": number})])
        time.sleep(0.3)  # Redis answers all six meanwhile: 24 bytes in the socket
        direct.read()
        assert not direct.unanswered


def test_a_read_that_found_all_there_was_asks_the_socket_once(monkeypatch):
    publish("bench.warm", {"type": "test.message"})
    assert publisher().flush(5)
    direct = direct_ready()
    calls = []

    class Counting:
        def __init__(self, sock):
            self.sock = sock

        def recv(self, size):
            calls.append(size)
            return self.sock.recv(size)

        def __getattr__(self, name):
            return getattr(self.sock, name)

    with publisher()._lock:
        monkeypatch.setattr(direct, "socket", Counting(direct.socket))
        direct.send([("bench.read", {"type": "test.message"})])
        time.sleep(0.2)
        calls.clear()
        direct.read()
        assert not direct.unanswered and len(calls) == 1
