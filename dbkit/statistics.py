"""Statistics taken again for a table that has outgrown them, before autovacuum gets to it.

PostgreSQL keeps the plan of a prepared statement, and of each foreign-key check (an INSERT of a
job's event checks that its job exists), for as long as the connection lives, once it has run
it a few times: a *generic* plan, chosen for the table's size when it was made. A connection
that made it while the jobs table held a handful of rows keeps a sequential scan, and nothing
tells it to plan again until the table's statistics change (`ANALYZE`, which autovacuum runs
once a table has changed by a tenth, at most once a minute). Meanwhile each check reads the
whole table: a fresh installation that runs a few jobs and then a burst of thousands spent
0.040 ms of PostgreSQL's time per check against 0.003, and a growing share of it with every job
(bench/README.md, "A plan made on a one-row table").

`tables_analyze_if_grown` takes the statistics again (`ANALYZE`) of each table that now holds
`GROWTH` times the rows its statistics say, from `MINIMUM_ROWS` up: new statistics make every
connection plan its kept statements again at their next use. A table in steady state never
qualifies (autovacuum keeps its statistics within a tenth); a young one does a few times (at 500
rows, then each time it has grown fourfold), a few milliseconds each, as PostgreSQL's
documentation advises after loading a large amount of data
(https://www.postgresql.org/docs/current/populate.html).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

logger = logging.getLogger(__name__)

# A table whose statistics count fewer rows than a GROWTH-th of what it holds, with at least
# MINIMUM_ROWS rows, is analysed again.
GROWTH = 4
MINIMUM_ROWS = 500


def tables_analyze_if_grown(tables: Iterable[str], *, rows_added: int | Mapping[str, int] = 0,
                            using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """`ANALYZE` each of `tables` (names as in `Meta.db_table`) that has outgrown its statistics;
    returns the names analysed. `rows_added`: rows the caller has just committed to each of them
    (or to each table it names), which PostgreSQL's activity counters (`n_live_tup`, sent every
    second or so) may not count yet.

    One read of the tables' statistics when none has grown. PostgreSQL only, and outside a
    transaction (`ANALYZE` would hold its lock until the caller's commit): otherwise nothing is
    done. A table being vacuumed or analysed at the moment is skipped (`SKIP_LOCKED`), and so is
    one this role does not own (PostgreSQL would refuse it with a warning, at every pass).

    Never raises a database error: a caller's own work is done by then (a batch submit's jobs are
    committed and sent: an error here would have its operator submit them again); the error is
    logged, and the next batch or pass tries again."""
    connection = connections[using]
    tables = list(tables)
    if connection.vendor != "postgresql" or connection.in_atomic_block or not tables:
        return []
    analysed: list[str] = []
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                # pg_stat_user_tables.n_live_tup, without the view's other columns and joins; only
                # the tables this role may analyse (it owns them, or is a member of their owner's role).
                "SELECT c.relname, c.reltuples, pg_stat_get_live_tuples(c.oid) FROM pg_class c "
                "WHERE c.oid = ANY(ARRAY(SELECT to_regclass(t) FROM unnest(%s::text[]) AS t)) "
                "AND pg_has_role(c.relowner, 'USAGE')",
                [[connection.ops.quote_name(table) for table in tables]],
            )
            for name, counted, live in cursor.fetchall():
                added = rows_added.get(name, 0) if isinstance(rows_added, Mapping) else rows_added
                live = max(live, max(counted, 0) + added)
                if not _outgrown(counted=counted, live=live):
                    continue
                cursor.execute(f"ANALYZE (SKIP_LOCKED) {connection.ops.quote_name(name)}")
                analysed.append(name)
                logger.info("table %s analysed: about %d rows, its statistics said %d", name, live, max(counted, 0))
    except DatabaseError as exc:
        logger.warning("the statistics of %s were not taken again: %s: %s", ", ".join(tables),
                       type(exc).__name__, exc)
    return analysed


def _outgrown(*, counted: float, live: float) -> bool:
    """`counted`: the rows the statistics say (-1: never analysed); `live`: the rows there now."""
    return live >= MINIMUM_ROWS and live > GROWTH * max(counted, 0)
