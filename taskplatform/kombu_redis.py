"""kombu's Redis transports, with one client per channel instead of one per command.

kombu's Redis channel builds a new redis-py client (`Channel._create_client`) for every
synchronous operation: each message published, and in the worker each delivery's bookkeeping
and each late ack (`QoS.append`, `QoS.ack`). A client is cheap to use but not to build: its
constructor fills a table of some 170 response callbacks, about 0.12 ms of CPU each time on
this machine (bench/README.md, "kombu's client per command"). Celery's main worker process is
the drain's bottleneck, and it pays that two or three times per task; every web request that
dispatches a job pays it once.

Here a channel keeps the client it built for its connection pool and hands it out again. A
redis-py client without `single_connection_client` holds no connection of its own (each
command takes one from the pool and gives it back), so sharing it is what the pool is for. A
pool kombu replaced (`_disconnect_pools` after a lost connection) gets a client of its own.
The asynchronous client (the worker's BRPOP loop) is kombu's, unchanged.

`install()` (called where the Celery app is made) registers them under kombu's own names,
`redis`, `rediss` and `sentinel`: the broker URL stays what it was, so Flower, `celery inspect`
and the logs name the broker as before. A Unix socket (`redis+socket://`, the embedded Redis of
`make run` without REDIS_URL) is the `redis` transport too (kombu reads the `redis+` of the URL
as the transport's name), under the same URL.
"""

from __future__ import annotations

from typing import Any

import kombu.transport
from kombu.transport import redis as kombu_redis


class ClientKept:
    """The channel mixin: `_create_client()` returns the client it built last for the same pool."""

    _kept_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._kept_client
        if client is None or client.connection_pool is not pool:
            client = self._kept_client = super()._create_client()
        return client


class Channel(ClientKept, kombu_redis.Channel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(ClientKept, kombu_redis.SentinelChannel):
    pass


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


TRANSPORTS = {
    "redis": f"{__name__}:Transport",
    "rediss": f"{__name__}:Transport",
    "sentinel": f"{__name__}:SentinelTransport",
}


def install() -> None:
    """Make kombu's `redis`, `rediss` and `sentinel` transports these (idempotent)."""
    for name, path in TRANSPORTS.items():
        if kombu.transport.TRANSPORT_ALIASES.get(name) != path:
            kombu.transport.TRANSPORT_ALIASES[name] = path
            kombu.transport._transport_cache.pop(name, None)  # resolved before: resolve again
