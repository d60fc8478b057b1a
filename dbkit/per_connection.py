"""What depends only on a database connection's backend, worked out once and kept on it.

Django gives each thread a connection object of its own for an alias (a web process's request
threads, asgiref's threads), and the web processes hand their database work round a pool of such
threads: what was kept on one thread's connection only, each of the others built again at its
first request of that kind. An answer's reads and writes built in a thread that had not answered
before cost an answer some 15 ms more (bench/README.md, "What a new thread builds"). So what is
built for an alias is kept for the whole process too, and a connection of another thread takes
it from there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# {(alias, vendor, key): what was built}: for the connections of every thread of this process.
_shared: dict[tuple[str, str, str], Any] = {}
_MISSING: Any = object()


def once_per_connection(connection: Any, key: str, build: Callable[[], T]) -> T:
    """`build()`, called the first time this process is asked for `key` on `connection`'s alias
    (a Django connection), and kept after: a statement's fixed text, a column's converters. `key`
    names what is kept; it must not be one of the connection's own attributes. What is kept must
    depend only on the backend (its vendor, its quoting, its features), never on the thread or
    the open connection: it is shared by every thread's connection of the alias."""
    try:
        return connection.__dict__[key]
    except KeyError:
        pass
    shared_key = (connection.alias, connection.vendor, key)
    value = _shared.get(shared_key, _MISSING)
    if value is _MISSING:
        # Two threads may build it at once; the first kept wins, so every thread holds the same
        # object (a kept text is one string, whose prepared statements psycopg finds by it).
        value = _shared.setdefault(shared_key, build())
    connection.__dict__[key] = value
    return value


def forget(connection: Any, key: str) -> None:
    """Drop what is kept under `key` for `connection`'s alias, in every thread's connection that
    asks for it next (a test that changed what is kept)."""
    connection.__dict__.pop(key, None)
    _shared.pop((connection.alias, connection.vendor, key), None)
