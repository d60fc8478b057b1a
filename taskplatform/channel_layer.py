"""The Redis channel layer, with a connection pool that waits instead of failing.

channels-redis builds its pools with redis-py's `ConnectionPool`, which in redis-py 8 holds at
most 100 connections per event loop and raises `MaxConnectionsError` ("Too many connections") at
once beyond that. A burst of websockets (a server restart makes every client reconnect at the
same moment; the benchmark opens 1,000) needs more than 100 `group_add`s in flight, and the
consumers that lose the race crash. A `BlockingConnectionPool` queues those commands for a free
connection instead (up to `timeout` seconds), keeping the number of connections bounded.
"""

from __future__ import annotations

from typing import Any

from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer
from redis import asyncio as aioredis


class RedisChannelLayer(BaseRedisChannelLayer):
    """`channels_redis.core.RedisChannelLayer` with blocking pools (see the module docstring).

    Each host may set `max_connections` (default 100) and `timeout` (seconds to wait for a free
    connection, default 10) beside its `address` and the usual connection options.
    """

    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        if "address" not in host:  # sentinels and the like: as channels-redis does it
            return super().create_pool(index)
        address = host.pop("address")
        host.setdefault("max_connections", 100)
        host.setdefault("timeout", 10)
        return aioredis.BlockingConnectionPool.from_url(address, **host)
