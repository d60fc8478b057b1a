"""Every Redis client of the platform, from the one `REDIS_URL` setting, which may name a plain
server or a group of Sentinels that follow a master through a failover.

    redis://[:password@]host:6379/0                  one server (also rediss://, unix:///path?db=0)
    sentinel://[:password@]s1:26379,s2:26379,s3:26379/0?master_name=mymaster

With Sentinels, every client asks them where the master is and asks again after a lost
connection, so the broker (kombu's `sentinel://` transport, `taskplatform.redis_urls`), the
channel layer (channels-redis's Sentinel pool), the cache (throttling, `SentinelAwareRedisCache`)
and the platform's own clients (`redis_client`, `async_redis_client`) all follow the master
after a failover. The password, when given, is the master's (`requirepass`); `sentinel_password`
in the query is the Sentinels' own, when they have one.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel, SentinelConnectionPool

SENTINEL_SCHEME = "sentinel"
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelTarget:
    """A master found through Sentinels."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    password: str | None = None
    sentinel_password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def sentinel_target(url: str) -> SentinelTarget | None:
    """The Sentinel setup that `url` names, or None for a plain Redis URL.

    Raises ValueError naming what is wrong (no hosts, no master name, a bad port or db).
    """
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        return None
    netloc = parts.netloc
    password = None
    if "@" in netloc:
        credentials, netloc = netloc.rsplit("@", 1)
        password = unquote(credentials.split(":", 1)[1] if ":" in credentials else credentials) or None
    sentinels = []
    for entry in filter(None, netloc.split(",")):
        host, colon, port = entry.rpartition(":")
        if not colon:
            host, port = entry, ""
        try:
            sentinels.append((host, int(port) if port else DEFAULT_SENTINEL_PORT))
        except ValueError:
            raise ValueError(f"REDIS_URL: the Sentinel address {entry!r} has no valid port") from None
    if not sentinels:
        raise ValueError("REDIS_URL: a sentinel:// URL names at least one Sentinel host:port")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    master_name = query.pop("master_name", "") or query.pop("service_name", "")
    if not master_name:
        raise ValueError("REDIS_URL: a sentinel:// URL needs ?master_name=NAME (the name the Sentinels monitor)")
    path = parts.path.strip("/")
    try:
        db = int(path) if path else 0
    except ValueError:
        raise ValueError(f"REDIS_URL: the database number {path!r} is not a number") from None
    sentinel_password = query.pop("sentinel_password", None)
    return SentinelTarget(tuple(sentinels), master_name, db, password, sentinel_password, query)


def _sentinel(target: SentinelTarget, **options: Any) -> Sentinel:
    sentinel_kwargs = {key: options[key] for key in ("socket_timeout", "socket_connect_timeout") if key in options}
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    return Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)


def redis_client(url: str | None = None, **options: Any) -> redis.Redis:
    """A client on `url` (default settings.REDIS_URL) with redis-py's `options`
    (socket_timeout, decode_responses, …); through the Sentinels when the URL names them."""
    if url is None:
        from django.conf import settings

        url = settings.REDIS_URL
    target = sentinel_target(url)
    if target is None:
        return redis.Redis.from_url(url, **options)
    return _sentinel(target, **options).master_for(
        target.master_name, db=target.db, password=target.password, **options
    )


def async_redis_client(url: str | None = None, **options: Any) -> aioredis.Redis:
    """`redis_client` for asyncio (redis-py's `redis.asyncio`): a client on `url` (default
    settings.REDIS_URL), through the Sentinels when the URL names them."""
    if url is None:
        from django.conf import settings

        url = settings.REDIS_URL
    target = sentinel_target(url)
    if target is None:
        return aioredis.Redis.from_url(url, **options)
    sentinel_kwargs = {key: options[key] for key in ("socket_timeout", "socket_connect_timeout") if key in options}
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    sentinel = AsyncSentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(target.master_name, db=target.db, password=target.password, **options)


def channel_layer_host(url: str, **options: Any) -> dict[str, Any]:
    """One entry of the channel layer's `hosts` for `url` (channels-redis takes an `address`,
    or `sentinels` with a `master_name`), with connection `options`."""
    target = sentinel_target(url)
    if target is None:
        return {"address": url, **options}
    host: dict[str, Any] = {
        "sentinels": [list(address) for address in target.sentinels], "master_name": target.master_name,
        "db": target.db, **{k: v for k, v in options.items() if k not in ("max_connections", "timeout")},
    }
    if target.password:
        host["password"] = target.password
    if target.sentinel_password:
        host["sentinel_kwargs"] = {"password": target.sentinel_password}
    return host


# The cache's connection pools, one per process, server and options. Django keeps a cache object
# per asyncio context, and so, under ASGI, per request: with pools of its own, every request
# would open a new connection to Redis (a TCP handshake and a HELLO before its one INCR).
_cache_pools: dict[tuple[int, str, str], Any] = {}
_cache_pools_lock = threading.Lock()


# One `redis.Redis` per pool, kept: Django builds a new one for every cache call (each builds its
# table of response callbacks), which the API's throttle paid on every request. A client takes
# a connection from its pool for each command, so threads may share it.
_cache_clients: dict[int, Any] = {}


class SentinelAwareCacheClient(RedisCacheClient):
    """Django's Redis cache client, with one connection pool and one client per process shared
    by every cache object, whose pool asks the Sentinels for the master when LOCATION is a
    sentinel:// URL (Django's own client takes plain URLs only)."""

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        pool = self._get_connection_pool(write)
        client = _cache_clients.get(id(pool))  # pools are never dropped (`_cache_pools`): ids stay theirs
        if client is None:
            client = _cache_clients[id(pool)] = self._client(connection_pool=pool)
        return client

    def _get_connection_pool(self, write: bool) -> Any:
        server = self._servers[self._get_connection_pool_index(write)]
        key = (os.getpid(), server, repr(sorted(self._pool_options.items())))
        pool = _cache_pools.get(key)
        if pool is None:
            with _cache_pools_lock:
                pool = _cache_pools.get(key)
                if pool is None:
                    target = sentinel_target(server)
                    if target is None:
                        pool = self._pool_class.from_url(server, **self._pool_options)
                    else:
                        pool = SentinelConnectionPool(
                            target.master_name, _sentinel(target), db=target.db, password=target.password,
                            **self._pool_options,
                        )
                    _cache_pools[key] = pool
        return pool


class SentinelAwareRedisCache(RedisCache):
    """`django.core.cache.backends.redis.RedisCache` that also takes a sentinel:// LOCATION."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        # Django splits a LOCATION string at commas into several servers; a sentinel:// URL's
        # commas separate the Sentinels of one server, so it is passed whole.
        if isinstance(server, str) and sentinel_target(server) is not None:
            server = [server]  # type: ignore[assignment]
        super().__init__(server, params)
        self._class = SentinelAwareCacheClient
