"""The platform's one clock: the database server's.

Workers, web servers and beat run on many hosts, and host clocks disagree: a lease written with
a clock 90 s ahead looks alive 90 s too long to a reconciler on another host, and one written
90 s behind looks expired while its run is alive. So every time that one process writes and
another compares (a run's lease, a retry's `run_after`, the dispatch grace's `updated_at`, a
question's deadline, a wait's next look and deadline, a webhook's next attempt, the scheduler's
lease) is written and compared with the database's clock:

- in a statement, as an expression: `db_now()` (Django's `Now()`: PostgreSQL's
  `statement_timestamp()`) and `db_now_plus(seconds)`, inside the UPDATE, INSERT or WHERE that
  needs it, at no extra round trip;
- where Python needs the value (to choose the next mark, to say "due in 5 s"),
  `database_now()`: one `SELECT statement_timestamp()`;
- where a row is found again by a time read from it (a conditional UPDATE, a keyset),
  `db_time_filter(field, lookup, value)`: the same on SQLite, where times are text.

The host's clock is left to what only people read (an event's `created_at`) and to what one
process measures for itself (`time.monotonic()`). `tests/jobs/test_clock.py` greps for the rest.

`jobs.testing.Clock` moves this clock in a test of a kind (`clock_shift`), without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.expressions import Expression
from django.db.models.functions import Now

_ZERO = timedelta(0)
# The type of `db_now_plus`'s expression: one field for all of them, as Django's `Now` has (a
# field built per call was 2 % of a no-op job's CPU).
_TIMESTAMP = DateTimeField()
# How far `jobs.testing.Clock` has moved the clock (a function: the harness's offset grows).
_unshifted: Callable[[], timedelta] = lambda: _ZERO  # noqa: E731
_shift = _unshifted
# `db_now_plus`'s expressions by their seconds while the clock is not moved (every run's moves ask
# for the same few: a claim's lease, a retry's delay); a dict's lookup, where a timedelta made and
# hashed each time was about 1.5 % of a pool process's CPU per no-op job (bench/README.md).
_by_seconds: dict[float, Expression] = {}


def db_now() -> Expression:
    """The database's time now, as an expression for `update()`, `filter()`, `create()`."""
    return db_now_plus(0)


def db_now_plus(seconds: float) -> Expression:
    """The database's time `seconds` from now (negative: ago), as an expression.

    The same object for the same time from now (the last few kept): the ORM copies an
    expression before it resolves it into a statement, so one object serves every statement,
    and a move that writes it finds its statement's shape already worked out on it
    (`jobs.statements`: a claim's and a lease renewal's are the same every time)."""
    if _shift is _unshifted:
        try:
            return _by_seconds[seconds]
        except KeyError:
            expression = _expression_for(timedelta(seconds=seconds))
            if len(_by_seconds) < _expression_for.cache_info().maxsize:
                _by_seconds[seconds] = expression
            return expression
    return _expression_for(timedelta(seconds=seconds) + _shift())


@lru_cache(maxsize=64)
def _expression_for(delta: timedelta) -> Expression:
    if not delta:
        return Now()
    return ExpressionWrapper(Now() + Value(delta), output_field=_TIMESTAMP)


def db_time_filter(field: str, lookup: str, value: datetime) -> Q:
    """`Q(**{f"{field}__{lookup}": value})`, for `value` a time read from the column `field`.

    On SQLite a time is text, compared as text: the database's clock writes it with milliseconds
    (`... 12:00:00.379`, `Now()` and the columns' defaults) and Django binds a time with
    microseconds (`... 12:00:00.379000`, none on a whole second), so a time read back compared
    unequal to its own row: the reconciler's conditional touch never matched, and no lost
    message was sent again. There the column is compared as Django writes a time."""
    if connection.vendor == "sqlite":
        written = ExpressionWrapper(F(field) + Value(_ZERO), output_field=_TIMESTAMP)
        return Q(written.get_lookup(lookup)(written, value))
    return Q(**{f"{field}__{lookup}": value})


def database_now() -> datetime:
    """The database's time now, read in one statement (aware, UTC)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')")
            now = datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)
        else:
            cursor.execute("SELECT statement_timestamp()")
            now = cursor.fetchone()[0]
    return now + _shift()


@contextmanager
def clock_shift(shift: Callable[[], timedelta]) -> Iterator[None]:
    """Move the platform's clock by `shift()` while the block runs (for `jobs.testing.Clock`)."""
    global _shift
    previous, _shift = _shift, shift
    try:
        yield
    finally:
        _shift = previous
