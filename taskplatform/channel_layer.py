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

import logging
import time
from typing import Any

from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer
from redis import asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

# What a receive raises when Redis went away (closed, refused, reset, timed out).
CONNECTION_LOST = (RedisConnectionError, RedisTimeoutError, OSError)


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

    async def group_send(self, group: str, message: dict) -> None:
        """channels-redis' group_send, with a cheap way out for a group nobody is in.

        Workers push every event to its job's group, and most jobs have no follower at that
        moment: one pipelined round trip (drop the expired members, read the rest) finds the group
        empty, where channels-redis spends two before it looks. Members present: the usual send.
        """
        key = self._group_key(group)
        connection = self.connection(self.consistent_hash(group))
        pipe = connection.pipeline(transaction=False)
        pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
        pipe.exists(key)
        _, present = await pipe.execute()
        if present:
            await super().group_send(group, message)

    async def groups_followed(self, groups: list[str]) -> set[str]:
        """Which of `groups` have a member: one pipelined round trip per Redis host for all of
        them (expired members dropped first, as a send does). The publisher (`jobs.broadcast`)
        asks this once per batch and sends only to those."""
        by_host: dict[int, list[str]] = {}
        for group in groups:
            by_host.setdefault(self.consistent_hash(group), []).append(group)
        oldest = int(time.time()) - self.group_expiry
        followed: set[str] = set()
        for index, names in by_host.items():
            pipe = self.connection(index).pipeline(transaction=False)
            for group in names:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=oldest)
                pipe.exists(key)
            answers = await pipe.execute()
            followed.update(group for group, present in zip(names, answers[1::2], strict=True) if present)
        return followed

    async def receive_waiting(self, channel: str, limit: int = 100) -> list[dict]:
        """The messages already waiting for the process-specific `channel` (up to `limit`), in
        order, without blocking: one ZPOPMIN where `receive` spends four round trips per message.

        For a reader that has just had one message from `receive` and wants the rest of a burst
        at once (the live fan-out, `jobs.fanout`). No backup copy is kept while they are handled,
        unlike `receive`: a process that dies now loses them, which the fan-out's readers
        tolerate (the durable event log is the truth). Empty for other channels.
        """
        if "!" not in channel:
            return []
        real_channel = self.non_local_name(channel)
        connection = self.connection(self.consistent_hash(real_channel))
        popped = await connection.zpopmin(self.prefix + real_channel, limit)
        messages = []
        for member, _score in popped:
            message = self.deserialize(member)
            # Every process-specific channel of this layer shares the key, and a group message
            # names the channels it is for (a list): those other than ours get it where their own
            # `receive` will look, as channels-redis does.
            owners = message.pop("__asgi_channel__", [channel])
            for owner in [owners] if isinstance(owners, str) else owners:
                if owner == channel:
                    messages.append(message)
                else:
                    self.receive_buffer[owner].put_nowait(message)
        return messages

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
