"""Retrying a transaction that lost a race for the database.

The platform takes its locks in one order (the job's row first, then its questions and waits),
so its own writes do not deadlock one another. What is left (a lock some other code takes, a
serialization failure) aborts one transaction with an error that only means "try again": the
public services are wrapped in `retry_on_conflict`, so that their caller never sees it as a 500.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import OperationalError, transaction

from jobs.backoff import backoff_with_jitter
from jobs.errors import Busy

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# PostgreSQL's SQLSTATEs of an aborted transaction that succeeds when simply run again.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure
ATTEMPTS = 5


def lost_a_race(exc: BaseException) -> bool:
    """Is `exc` a deadlock or a serialization failure (the transaction may simply run again)?"""
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES


def retry_on_conflict(fn: F) -> F:
    """Run `fn` again (up to ATTEMPTS times in all, after a short back-off with jitter) when its
    transaction lost a deadlock or a serialization failure; then raise `Busy` (503, retry later).

    Only the outermost call retries: inside a caller's transaction the whole transaction is
    lost, so the error goes up to whoever opened it. `fn` must be safe to run again from the
    start, as a service whose transaction rolled back is.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if transaction.get_connection().in_atomic_block:
            return fn(*args, **kwargs)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except OperationalError as exc:
                if not lost_a_race(exc):
                    raise
                if attempt == ATTEMPTS:
                    logger.warning("%s lost a database race %d times; giving up: %s", fn.__qualname__, attempt, exc)
                    raise Busy(
                        "the database was busy with a conflicting change; nothing was changed, send the request again"
                    ) from exc
                delay = backoff_with_jitter(attempt, base=0.02, cap=0.5)
                logger.info("%s lost a database race (%s); trying again in %.3fs", fn.__qualname__, exc, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    return wrapper  # type: ignore[return-value]
