"""Turn the one `REDIS_URL` setting into the URL each client library expects."""

from typing import Any
from urllib.parse import quote, urlsplit

from jobs.redis_clients import sentinel_target


def redis_url_for_celery(redis_url: str) -> str:
    """Return the broker URL kombu understands for `redis_url`.

    redis-py and channels-redis take `unix:///path/to.sock?db=N`; kombu spells a Unix socket
    `redis+socket:///path/to.sock?virtual_host=N`. TCP URLs (`redis://`, `rediss://`) are the
    same for all of them. A `sentinel://` URL (see `jobs.redis_clients`) becomes kombu's Sentinel
    transport, one `sentinel://host:port/db` per Sentinel joined by `;` (the master's name goes in
    the transport options: `broker_transport_options_for`).
    """
    target = sentinel_target(redis_url)
    if target is not None:
        auth = f":{quote(target.password, safe='')}@" if target.password else ""
        return ";".join(f"sentinel://{auth}{host}:{port}/{target.db}" for host, port in target.sentinels)
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    query = parts.query.replace("db=", "virtual_host=")
    return f"redis+socket://{parts.path}" + (f"?{query}" if query else "")


def broker_transport_options_for(redis_url: str) -> dict[str, Any]:
    """The broker transport options that `redis_url` needs: the master's name (and the
    Sentinels' own password) for a `sentinel://` URL, nothing for a plain server."""
    target = sentinel_target(redis_url)
    if target is None:
        return {}
    options: dict[str, Any] = {"master_name": target.master_name}
    if target.sentinel_password:
        options["sentinel_kwargs"] = {"password": target.sentinel_password}
    return options
