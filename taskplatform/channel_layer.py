"""The Redis channel layer, with a connection pool that waits instead of failing.

channels-redis builds its pools with redis-py's `ConnectionPool`, which in redis-py 8 holds at
most 100 connections per event loop and raises `MaxConnectionsError` ("Too many connections") at
once beyond that. A burst of websockets (a server restart makes every client reconnect at the
same moment; the benchmark opens 1,000) needs more than 100 `group_add`s in flight, and the
consumers that lose the race crash. A `BlockingConnectionPool` queues those commands for a free
connection instead (up to `timeout` seconds), keeping the number of connections bounded.

Group memberships live in Redis only. A Redis that restarts empty forgets them, so every group
this process had joined would stay silent (its pushes lost) until the next renewal, up to 30 s
later (`jobs.fanout`). The layer therefore remembers the memberships of this process's channels
and, when a receive has lost the connection, adds them again before it waits for the next
message: live pushes resume within about a second of Redis coming back (tests/chaos).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from typing import Any

import msgpack
import redis
import redis.sentinel
from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer
from channels_redis.serializers import MsgPackSerializer
from redis import asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

# What a receive raises when Redis went away (closed, refused, reset, timed out).
CONNECTION_LOST = (RedisConnectionError, RedisTimeoutError, OSError)

# A group message to each of its members' keys (KEYS): ARGV holds one message per key, then one
# capacity per key, then the time (the score) and the keys' expiry. A key already holding its
# capacity is skipped and counted; the count is returned.
_SEND_TO_CHANNELS = """
local keys = #KEYS
local now, expiry = ARGV[2 * keys + 1], ARGV[2 * keys + 2]
local skipped = 0
for index = 1, keys do
    if redis.call('ZCARD', KEYS[index]) < tonumber(ARGV[keys + index]) then
        redis.call('ZADD', KEYS[index], now, ARGV[index])
        redis.call('EXPIRE', KEYS[index], expiry)
    else
        skipped = skipped + 1
    end
end
return skipped
"""


# The members of each group (KEYS), its expired members (scored at or before ARGV[1]) dropped
# first: the answer is a flat list of (the group's position in KEYS, its members) for each group
# that has any.
_GROUP_MEMBERS = """
local found = {}
for index = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[index], 0, ARGV[1])
    local members = redis.call('ZRANGE', KEYS[index], 0, -1)
    if #members > 0 then
        found[#found + 1] = index
        found[#found + 1] = members
    end
end
return found
"""
_GROUP_MEMBERS_SHA = hashlib.sha1(_GROUP_MEMBERS.encode()).hexdigest()


# Pushes to groups (KEYS), written by `jobs.broadcast` without waiting for the answer: for each
# group, drop its expired members (scored at or before ARGV[1]), then add the group's message to
# each of its members' keys as `group_send` does. ARGV: the oldest member score kept, the oldest
# message score kept, the keys' expiry, the capacity of a key, the layer's prefix, then for each
# group its message's score (the time it was sent: a key gives its messages in score order, so
# two messages of one command to the same key need different scores) and its message head: the
# serialised message (its random prefix and a msgpack map with one entry more than it holds,
# ending with the key `__asgi_channel__`), to which the script appends the list of the member
# channels sharing the key. The members' keys are computed here (as
# `_map_channel_keys_to_connection` does), so a layer on one Redis host only. Returns how many keys
# over their capacity were skipped.
_PUBLISH = """
local oldest, stale, expiry = ARGV[1], ARGV[2], ARGV[3]
local capacity, prefix = tonumber(ARGV[4]), ARGV[5]
local function packed_string(text)
    local size = #text
    if size < 32 then return string.char(0xa0 + size) .. text end
    if size < 256 then return string.char(0xd9, size) .. text end
    return string.char(0xda, math.floor(size / 256), size % 256) .. text
end
local function packed_list(items)
    local parts = {}
    for index, item in ipairs(items) do parts[index] = packed_string(item) end
    local count = #items
    local head = count < 16 and string.char(0x90 + count) or string.char(0xdc, math.floor(count / 256), count % 256)
    return head .. table.concat(parts)
end
local skipped = 0
for index = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[index], 0, oldest)
    local members = redis.call('ZRANGE', KEYS[index], 0, -1)
    local keys, channels = {}, {}
    for _, channel in ipairs(members) do
        local bang = string.find(channel, '!', 1, true)
        local key = prefix .. (bang and string.sub(channel, 1, bang) or channel)
        if channels[key] == nil then
            channels[key] = {}
            keys[#keys + 1] = key
        end
        table.insert(channels[key], channel)
    end
    for _, key in ipairs(keys) do
        redis.call('ZREMRANGEBYSCORE', key, 0, stale)
        if redis.call('ZCARD', key) < capacity then
            redis.call('ZADD', key, ARGV[4 + 2 * index], ARGV[5 + 2 * index] .. packed_list(channels[key]))
            redis.call('EXPIRE', key, expiry)
        else
            skipped = skipped + 1
        end
    end
end
return skipped
"""
_PUBLISH_SHA = hashlib.sha1(_PUBLISH.encode()).hexdigest()
# A pushed message's score is the time in whole microseconds, at least one above the one before it:
# the smallest step a score near the current time (about 1.8e9 seconds, a double) keeps distinct,
# with a margin. It is written as decimal text from the integer (`_score_text`): `repr` of a float
# finds its shortest text digit by digit, about 6,500 instructions a push.
PUSH_SCORE_STEP_US = 1
_CHANNELS_KEY = msgpack.packb("__asgi_channel__")


def _score_text(microseconds: int) -> str:
    """A score of `microseconds` since the epoch, as seconds in decimal (`1733300000.000001`)."""
    seconds, fraction = divmod(microseconds, 1_000_000)
    return f"{seconds}.{fraction:06d}"


def _map_header(size: int) -> bytes:
    """msgpack's header of a map of `size` entries."""
    if size < 16:
        return bytes([0x80 | size])
    if size < 1 << 16:
        return b"\xde" + size.to_bytes(2, "big")
    return b"\xdf" + size.to_bytes(4, "big")


def _members_found(names: list[str], answer: list) -> dict[str, list[str]]:
    """`_GROUP_MEMBERS`' answer for the groups `names`, as {group: its member channels}."""
    return {names[position - 1]: [channel.decode() for channel in channels]
            for position, channels in zip(answer[::2], answer[1::2], strict=True)}


def _plain_client(host: dict[str, Any]) -> Any:
    """A plain redis-py client for one entry of the layer's `hosts`, made as channels-redis makes
    its asyncio pools (`channels_redis.utils.create_pool`; an address gets a pool that waits for a
    free connection, as `RedisChannelLayer.create_pool`)."""
    host = dict(host)
    if "address" in host:
        address = host.pop("address")
        host.setdefault("max_connections", 100)
        host.setdefault("timeout", 10)
        return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(address, **host))
    master_name = host.pop("master_name")
    sentinel = redis.sentinel.Sentinel(host.pop("sentinels"), sentinel_kwargs=host.pop("sentinel_kwargs", None))
    return redis.Redis(connection_pool=redis.sentinel.SentinelConnectionPool(master_name, sentinel, **host))


class RedisChannelLayer(BaseRedisChannelLayer):
    """`channels_redis.core.RedisChannelLayer` with blocking pools that re-joins its groups after
    a lost connection (see the module docstring).

    Each host may set `max_connections` (default 100) and `timeout` (seconds to wait for a free
    connection, default 10) beside its `address` and the usual connection options.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memberships: dict[str, set[str]] = {}  # group -> this process's channels in it
        self.rejoin_needed = False
        self.sync_clients: dict[int, Any] = {}  # host index -> a plain client (`connection_now`)
        self._last_push_score = 0  # the score (µs) of the last message `push_command` wrote

    async def group_add(self, group: str, channel: str) -> None:
        await super().group_add(group, channel)
        self.memberships.setdefault(group, set()).add(channel)

    async def group_discard(self, group: str, channel: str) -> None:
        await super().group_discard(group, channel)
        channels = self.memberships.get(group)
        if channels is not None:
            channels.discard(channel)
            if not channels:
                del self.memberships[group]

    async def receive(self, channel: str) -> Any:
        if self.rejoin_needed:
            await self.groups_rejoin()  # raises while Redis is still away: the caller retries
        try:
            return await super().receive(channel)
        except CONNECTION_LOST:
            # Redis may come back empty: add the memberships again before the next receive.
            self.rejoin_needed = True
            raise

    async def group_members(self, groups: list[str]) -> dict[str, list[str]]:
        """The member channels of each of `groups` that has any: one round trip per Redis host for
        all of them (a script that drops the expired members first, as channels-redis does, and
        answers only for the groups that have members), where a pipeline took two commands per
        group. `group_members_now` is the same from a plain thread (the publisher's)."""
        members: dict[str, list[str]] = {}
        for index, names, keys, oldest in self._members_asks(groups):
            connection = self.connection(index)
            try:
                answer = await connection.evalsha(_GROUP_MEMBERS_SHA, len(keys), *keys, oldest)
            except NoScriptError:  # the server has not seen it yet (or restarted since): load it
                await connection.script_load(_GROUP_MEMBERS)
                answer = await connection.evalsha(_GROUP_MEMBERS_SHA, len(keys), *keys, oldest)
            members.update(_members_found(names, answer))
        return members

    async def group_send(self, group: str, message: dict, members: list[str] | None = None) -> None:
        """channels-redis' group_send in one round trip per Redis host, plus one to read the
        group's members unless the caller just read them (`members`, from `group_members`).

        channels-redis spends four, one after another: drop the group's expired members, read
        the rest, drop the members' expired messages, then add the message to each member (the
        script). Here the first two are `group_members`' script (a group nobody is in costs that
        one round trip), and the last two one pipeline per host. The semantics are
        channels-redis': expired members and messages dropped, a member over its capacity
        skipped (and logged), the channels sharing a Redis key named in the message
        (`__asgi_channel__`). `group_send_now` is the same from a plain thread.
        """
        assert self.require_valid_group_name(group), "Group name not valid"
        if members is None:
            members = (await self.group_members([group])).get(group, [])
        for pipe in self._send_pipelines(message, members, self.connection):
            self._over_capacity((await pipe.execute())[-1], group, members)

    # -- The same two, from a plain thread ------------------------------------------------------
    # The publisher of job events (`jobs.broadcast`) runs in a thread of every pool process and
    # asks these for every event: with redis-py's asyncio client and an event loop of its own,
    # the loop's machinery and the client's cost about as much CPU as the job's own statements
    # (bench/README.md, "Prepared statements"). These use a plain client per host, made on
    # first use in the process that uses it (its pool waits for a free connection, as above).

    def connection_now(self, index: int) -> Any:
        """A plain (not asyncio) client on host `index`, kept by this layer."""
        client = self.sync_clients.get(index)
        if client is None:
            client = self.sync_clients[index] = _plain_client(self.hosts[index])
        return client

    def warm_now(self) -> None:
        """Connect to every host and make sure each has the members script, so the first
        `group_members_now` pays neither (a new pool process's first push, otherwise ~20 ms late)."""
        for index in range(len(self.hosts)):
            self.connection_now(index).script_load(_GROUP_MEMBERS)

    def group_members_now(self, groups: list[str]) -> dict[str, list[str]]:
        """`group_members`, blocking this thread for its round trips."""
        members: dict[str, list[str]] = {}
        for index, names, keys, oldest in self._members_asks(groups):
            connection = self.connection_now(index)
            try:
                answer = connection.evalsha(_GROUP_MEMBERS_SHA, len(keys), *keys, oldest)
            except NoScriptError:  # the server has not seen it yet (or restarted since): load it
                connection.script_load(_GROUP_MEMBERS)
                answer = connection.evalsha(_GROUP_MEMBERS_SHA, len(keys), *keys, oldest)
            members.update(_members_found(names, answer))
        return members

    def group_send_now(self, group: str, message: dict, members: list[str]) -> None:
        """`group_send` to the `members` just read, blocking this thread for its round trip."""
        assert self.require_valid_group_name(group), "Group name not valid"
        for pipe in self._send_pipelines(message, members, self.connection_now):
            self._over_capacity(pipe.execute()[-1], group, members)

    # -- Pushes written without waiting (the publisher's direct path) ----------------------------
    def can_push_directly(self) -> bool:
        """Can `push_command` serve this layer? One Redis host (the script writes the members' keys
        where the group's is), one capacity for every channel, msgpack without encryption."""
        serializer = self._serializer
        return (self.ring_size == 1 and not self.channel_capacity and type(serializer) is MsgPackSerializer
                and serializer.crypter is None)

    def push_command(self, pushes: list[tuple[str, dict]]) -> list[Any]:
        """The command (EVALSHA of `_PUBLISH`) that sends each (group, message) of `pushes` as
        `group_send` would: the same keys, scores, expiries and capacity, and each message as
        `deserialize` reads it back, naming the member channels it is for.

        Each message is scored with the time, and later than the one before it: a key gives its
        messages in score order, and pushes written together (or within the clock's resolution)
        would otherwise share a score and be given in their random prefixes' order."""
        now_us = time.time_ns() // 1000
        now = now_us // 1_000_000
        score = self._last_push_score
        keys, scored = [], []
        for group, message in pushes:
            assert self.require_valid_group_name(group), "Group name not valid"
            if "__asgi_channel__" in message:
                raise ValueError("a pushed message must not name its channels")
            body = msgpack.packb(message)
            header = _map_header(len(message))
            size = self._serializer.random_prefix_length  # a message's uniqueness in its sorted set
            prefix = random.getrandbits(8 * size).to_bytes(size, "big") if size else b""
            keys.append(self._group_key(group))
            score = max(now_us, score + PUSH_SCORE_STEP_US)
            scored += (_score_text(score), prefix + _map_header(len(message) + 1) + body[len(header):] + _CHANNELS_KEY)
        self._last_push_score = score
        return ["EVALSHA", _PUBLISH_SHA, len(keys), *keys, now - self.group_expiry,
                now - int(self.expiry), self.expiry, self.capacity, self.prefix, *scored]

    def push_connection(self, socket_timeout: float) -> Any:
        """A new connection (redis-py's, not from a pool) to the layer's Redis, connected, with the
        push script loaded: for `jobs.broadcast`'s direct path. Blocks while it connects."""
        pool = self.connection_now(0).connection_pool
        connection = pool.make_connection()
        connection.socket_timeout = socket_timeout
        connection.socket_connect_timeout = socket_timeout
        connection.connect()
        connection.send_command("SCRIPT", "LOAD", _PUBLISH)
        connection.read_response()
        return connection

    def _members_asks(self, groups: list[str]) -> list[tuple[int, list[str], list[bytes], int]]:
        """(host index, group names, their keys, the oldest score kept) for each host."""
        by_host: dict[int, list[str]] = {}
        for group in groups:
            by_host.setdefault(self.consistent_hash(group), []).append(group)
        oldest = int(time.time()) - self.group_expiry
        return [(index, names, [self._group_key(group) for group in names], oldest)
                for index, names in by_host.items()]

    def _send_pipelines(self, message: dict, members: list[str], connection_for: Any) -> list[Any]:
        """One pipeline per host, filled, that adds `message` to each member's key (none when
        there are no members)."""
        if not members:
            return []
        by_host, message_for_key, capacity_for_key = self._map_channel_keys_to_connection(members, message)
        now = time.time()
        pipes = []
        for index, keys in by_host.items():
            pipe = connection_for(index).pipeline(transaction=False)
            for key in keys:
                pipe.zremrangebyscore(key, min=0, max=int(now) - int(self.expiry))
            pipe.eval(_SEND_TO_CHANNELS, len(keys), *keys, *(message_for_key[key] for key in keys),
                      *(capacity_for_key[key] for key in keys), now, self.expiry)
            pipes.append(pipe)
        return pipes

    @staticmethod
    def _over_capacity(skipped: int, group: str, members: list[str]) -> None:
        if skipped:
            logger.info("%s of %s channels over capacity in group %s", skipped, len(members), group)

    async def receive_unbacked(self, channel: str) -> dict:
        """The next message for the process-specific `channel`, in one blocking round trip
        (BZPOPMIN), where `receive` spends four: it first moves a backup copy back, then pops,
        then writes a backup copy of what it popped, then deletes it, and the message waits for
        the last two. For the one reader of this process's channel key, the live fan-out
        (`jobs.fanout`), whose messages are pushes of events the database keeps: a process that
        dies while handing one out loses it, as it would lose the sockets it was for. Messages
        for the process's other channels (none in a web process) go where their `receive` looks.
        """
        if "!" not in channel:
            return await self.receive(channel)
        if self.rejoin_needed:
            await self.groups_rejoin()  # raises while Redis is still away: the caller retries
        buffer = self.receive_buffer[channel]
        real_channel = self.non_local_name(channel)
        connection = self.connection(self.consistent_hash(real_channel))
        try:
            while buffer.empty():
                popped = await connection.bzpopmin(self.prefix + real_channel, timeout=self.brpop_timeout)
                if popped is not None:
                    self._route(channel, self.deserialize(popped[1]))
        except CONNECTION_LOST:
            self.rejoin_needed = True
            raise
        return buffer.get_nowait()

    async def receive_waiting(self, channel: str, limit: int = 100) -> list[dict]:
        """The messages already waiting for the process-specific `channel` (up to `limit`), in
        order, without blocking: one ZPOPMIN.

        For a reader that has just had one message from `receive_unbacked` and wants the rest of
        a burst at once (the live fan-out, `jobs.fanout`). As there, no backup copy is kept
        while they are handled. Empty for other channels.
        """
        if "!" not in channel:
            return []
        real_channel = self.non_local_name(channel)
        connection = self.connection(self.consistent_hash(real_channel))
        popped = await connection.zpopmin(self.prefix + real_channel, limit)
        buffer = self.receive_buffer[channel]
        for member, _score in popped:
            self._route(channel, self.deserialize(member))
        messages = []
        while not buffer.empty():
            messages.append(buffer.get_nowait())
        return messages

    def _route(self, channel: str, message: dict) -> None:
        """Put a popped message in the receive buffer of each channel it names: every
        process-specific channel of this layer shares one key, and a group message names the
        channels it is for (`__asgi_channel__`, a list; a direct send names one)."""
        owners = message.pop("__asgi_channel__", [channel])
        for owner in [owners] if isinstance(owners, str) else owners:
            self.receive_buffer[owner].put_nowait(message)

    async def groups_rejoin(self) -> int:
        """Add every remembered membership again (idempotent); return how many."""
        self.rejoin_needed = True
        added = 0
        for group, channels in list(self.memberships.items()):
            for channel in list(channels):
                await super().group_add(group, channel)
                added += 1
        self.rejoin_needed = False
        if added:
            logger.info("channel layer: joined %d group membership(s) again after a lost connection", added)
        return added

    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        if "address" not in host:  # sentinels and the like: as channels-redis does it
            return super().create_pool(index)
        address = host.pop("address")
        host.setdefault("max_connections", 100)
        host.setdefault("timeout", 10)
        return aioredis.BlockingConnectionPool.from_url(address, **host)
