"""Turn the one `REDIS_URL` setting into the URL each client library expects."""

from urllib.parse import urlsplit


def redis_url_for_celery(redis_url: str) -> str:
    """Return the broker URL kombu understands for `redis_url`.

    redis-py and channels-redis take `unix:///path/to.sock?db=N`; kombu spells a Unix socket
    `redis+socket:///path/to.sock?virtual_host=N`. TCP URLs (`redis://`, `rediss://`) are the
    same for all of them.
    """
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    query = parts.query.replace("db=", "virtual_host=")
    return f"redis+socket://{parts.path}" + (f"?{query}" if query else "")
