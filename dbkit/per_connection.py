"""What depends only on a database connection's backend, worked out once and kept on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def once_per_connection(connection: Any, key: str, build: Callable[[], T]) -> T:
    """`build()`, called the first time `connection` (a Django connection) is asked for `key`
    and kept on it after: a statement's fixed text, a column's converters. `key` names what is
    kept; it must not be one of the connection's own attributes."""
    try:
        return connection.__dict__[key]
    except KeyError:
        value = connection.__dict__[key] = build()
        return value
