"""A cursor whose statements PostgreSQL parses and plans once per connection.

Django sends every statement as text with its values written in (psycopg's client-side binding),
and PostgreSQL parses and plans each one again. The statements of the hot paths (a job's moves,
`jobs.statements`; the reads of `dbkit.kept`) have the same text every time, with only their values
changing: for a no-op job's claim and outcome, parsing and planning were about a third of the
time the two statements took (`bench/README.md`, "Prepared statements"). `prepared_cursor`
returns a Django cursor on the same connection whose statements go with server-side binding and
are prepared on first use (psycopg's `prepare=True`): later runs send only the values.

psycopg keeps the prepared statements per connection (at most `prepared_max`, the least recently
used deallocated first), so it works with Django's persistent connections and with its pool.
A connection pooler in transaction mode that does not follow prepared statements (PgBouncer
before 1.21, or 1.21+ with `max_prepared_statements = 0`) breaks them: there, set
`DATABASE_PREPARED_STATEMENTS=false` and the same statements go as before, as text.

The cursor itself is kept on the connection and lent to one `with` block at a time: making a
psycopg cursor for each statement (its adapters, its loaders, the time zone's check, Django's
wrapper) cost a no-op job's two statements 0.12 M of its 2.19 M instructions (`bench/README.md`,
"The cursor kept"). A block that asks for another prepared cursor while it holds the kept one
gets a cursor of its own, closed at its end, so rows not yet read are never lost.

A caller that names its `statement` gets the cursor kept for that text. psycopg works out a
statement's parameter dumpers and column loaders again whenever a cursor runs another text than
the one before (`Transformer`, kept only while the same string object runs again): one cursor
that alternated a job's claim and its outcome did so for every statement (`bench/README.md`, "A
cursor per statement"). Pass the same string object each time: an equal but different string
runs as well, only without that saving.

`prepared_fetch(connection, statement, params)` runs one named statement and returns its rows:
on the kept cursor itself, with Django's checks but without its wrapper, unless Django is to see
the statement (the hot paths use it).

Only for PostgreSQL with psycopg 3; anything else gets `connection.cursor()`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.utils import CursorWrapper
from django.utils.asyncio import async_unsafe

from dbkit.conf import setting


def _classes() -> tuple[Any, Any]:
    from django.db.backends.postgresql.base import CursorDebugWrapper, ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):
        """Server-side binding, and each statement prepared the first time this connection runs it."""

        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
        ) -> Any:
            return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)

    class PreparedDebugWrapper(CursorDebugWrapper):
        """Django's debug cursor (DEBUG, or a test capturing queries) records the text psycopg
        sent, which a prepared statement does not leave to read: record the statement with its
        values written in, as the client-side binding would have sent it."""

        def execute(self, sql: Any, params: Any = None) -> Any:
            shown = self.db.ops.compose_sql(sql, params) if params else sql
            with self.debug_sql(shown, params):
                return CursorWrapper.execute(self, sql, params)

    class Lent:
        """A wrapper of one of the connection's kept cursors: its close gives the cursor back instead."""

        kept: _Kept
        key: str | None

        def close(self) -> None:
            self.kept.lent.discard(self.key)

    class LentWrapper(Lent, CursorWrapper):
        pass

    class LentDebugWrapper(Lent, PreparedDebugWrapper):
        pass

    return PreparedCursor, PreparedDebugWrapper, LentWrapper, LentDebugWrapper


class _Kept:
    """A connection's kept prepared cursors: the psycopg connection and the time zone they were
    made for, a cursor for each statement named (None: the one for the others), and which of them
    a `with` block holds now."""

    __slots__ = ("raw", "timezone", "cursors", "lent")

    def __init__(self, raw: Any, timezone: Any) -> None:
        self.raw, self.timezone = raw, timezone
        self.cursors: dict[str | None, Any] = {}
        self.lent: set[str | None] = set()


KEPT = "_taskplatform_prepared_cursor"  # the `_Kept` of a Django connection, in its __dict__
# Cursors kept for named statements per connection; past this many (texts that keep changing),
# those not lent are closed and made again as needed.
MAX_STATEMENT_CURSORS = 64
_classes_made: tuple[Any, Any, Any, Any] | None = None
# psycopg prepares a statement once it ran this many times; only `prepare=True` does it here.
NEVER_BY_COUNT = 2**62


def _same_time_zone(connection: Any, cursor: Any) -> None:
    """As Django's `create_cursor`: the cursor reads timestamps in the connection's time zone."""
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg.postgres import types
    from psycopg.pq import Format

    tzloader = connection.connection.adapters.get_loader(types["timestamptz"].oid, Format.TEXT)
    if connection.timezone != tzloader.timezone:
        register_tzloader(connection.timezone, cursor)


def prepares(connection: Any) -> bool:
    """Whether `prepared_cursor(connection)` prepares (PostgreSQL on psycopg 3, and the setting)."""
    if connection.vendor != "postgresql" or not getattr(settings, "DATABASE_PREPARED_STATEMENTS", True):
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


@async_unsafe
def prepared_cursor(connection: Any, statement: str | None = None) -> Any:
    """A cursor on `connection` (a Django connection) whose statements are prepared: use it for a
    statement whose text repeats (and only for one statement with parameters: a prepared
    statement holds one command). With `statement`, the cursor kept for that text: run that
    statement on it. Elsewhere `connection.cursor()`."""
    global _classes_made
    if not prepares(connection):
        return connection.cursor()
    if _classes_made is None:
        _classes_made = _classes()
    cursor_class, debug_wrapper, lent_wrapper, lent_debug_wrapper = _classes_made
    # What `connection.cursor()` does (BaseDatabaseWrapper._cursor), with this cursor class.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        if raw.prepare_threshold is None:
            # Django turns psycopg's preparing off (None), which also refuses `prepare=True`.
            # A threshold no statement reaches lets only this cursor's statements be prepared:
            # Django's own cursors bind on the client side and never prepare.
            raw.prepare_threshold = NEVER_BY_COUNT
        connection.validate_thread_sharing()
        kept = connection.__dict__.get(KEPT)
        if kept is None or kept.raw is not raw or kept.timezone != connection.timezone:
            # The first, or the connection is a new one (closed and opened again), or its time zone
            # changed (a test's settings).
            kept = connection.__dict__[KEPT] = _Kept(raw, connection.timezone)
        if statement in kept.lent:  # a block inside the one holding it: a cursor of its own, closed at its end
            cursor = _made(cursor_class, connection, raw)
            return debug_wrapper(cursor, connection) if connection.queries_logged else connection.make_cursor(cursor)
        cursor = kept.cursors.get(statement)
        if cursor is None:
            if len(kept.cursors) >= MAX_STATEMENT_CURSORS:
                _forget_idle(kept)
            cursor = kept.cursors[statement] = _made(cursor_class, connection, raw)
        kept.lent.add(statement)
        wrapper = (lent_debug_wrapper if connection.queries_logged else lent_wrapper)(cursor, connection)
        wrapper.kept, wrapper.key = kept, statement
        return wrapper


@async_unsafe
def prepared_fetch(connection: Any, sql: str, params: Any, *, one: bool = False) -> Any:
    """Run the one statement `sql` with `params` as a `prepared_cursor(connection, sql)` would,
    and return its rows (`one`: its first row, or None). The hot paths' way: a job's moves, its
    submit, the kept reads.

    It does what Django's cursor and its wrapper do around a statement (the health check, the
    connection opened if need be, the thread's check, a broken transaction refused, psycopg's errors
    as Django's) on the connection's kept psycopg cursor itself, without making a wrapper for it:
    the wrapper's methods, its `with` block and the lending were 5.6 % of a no-op job's
    instructions (`bench/README.md`, "Bare baselines, and a statement without its wrapper"). When
    Django is to see the statement (DEBUG or a test capturing queries: `queries_logged`; an
    `execute_wrapper` installed), or the cursor kept for `sql` is lent to a block running now, it
    goes the way of `prepared_cursor`, wrapper and all; so it does when a tool patched Django's
    `CursorWrapper.execute` to trace statements."""
    kept = connection.__dict__.get(KEPT)
    cursor = None
    if kept is not None and not (connection.queries_logged or connection.execute_wrappers or sql in kept.lent
                                 or not _djangos_own_execute()):
        # What `prepared_cursor` checks first: the connection usable (the health check may close
        # it), open, and the kept cursors made for it, in its time zone, as prepared as the setting says.
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        if (kept.raw is connection.connection and kept.timezone == connection.timezone
                and setting("DATABASE_PREPARED_STATEMENTS", True)):
            cursor = kept.cursors.get(sql)
    if cursor is None:
        with prepared_cursor(connection, sql) as wrapped:
            wrapped.execute(sql, params)
            return wrapped.fetchone() if one else wrapped.fetchall()
    # Then what Django's cursor and its `CursorWrapper.execute` check, in their order.
    with connection.wrap_database_errors:
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        cursor.execute(sql, params, prepare=True)
        return cursor.fetchone() if one else cursor.fetchall()


# Django's `CursorWrapper.execute` as `prepared_fetch` last found it, and whether it was Django's own.
_execute_seen: tuple[Any, bool] = (None, False)


def _djangos_own_execute() -> bool:
    """Is `CursorWrapper.execute` still Django's? A tool that traces SQL by patching it (an APM's
    Django integration) is to see the hot statements too: `prepared_fetch` then takes the wrapper."""
    global _execute_seen
    execute = CursorWrapper.execute
    if execute is not _execute_seen[0]:
        _execute_seen = (execute, getattr(execute, "__module__", None) == "django.db.backends.utils")
    return _execute_seen[1]


def _forget_idle(kept: _Kept) -> None:
    """Close the kept cursors no block holds (their statements stay prepared on the connection)."""
    for key in [key for key in kept.cursors if key not in kept.lent]:
        kept.cursors.pop(key).close()


def _made(cursor_class: Any, connection: Any, raw: Any) -> Any:
    cursor = cursor_class(raw)
    _same_time_zone(connection, cursor)
    return cursor
