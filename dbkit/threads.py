"""Database work of a server process's own (not of one request), from its event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from django.db import connections


def off_request_thread(function: Callable) -> Callable:
    """`database_sync_to_async` for the periodic work of a process (not of one request): in a
    thread of the shared pool, and closing its connection after (back to the pool under the ASGI
    server), since that thread is not a request's and nothing else would close it."""

    def closing(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    return database_sync_to_async(closing, thread_sensitive=False)
