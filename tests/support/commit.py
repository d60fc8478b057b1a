"""Helpers for tests that capture `transaction.on_commit` callbacks."""

from __future__ import annotations

from collections.abc import Callable

from jobs.broadcast import event_publish, events_publish


def dispatches(callbacks: list[Callable]) -> list[Callable]:
    """The captured callbacks other than event pushes (every event schedules one of those)."""
    pushes = (event_publish, events_publish)
    return [callback for callback in callbacks if getattr(callback, "func", None) not in pushes]
