"""Which live groups someone follows, so that a move pushes only what a stream will receive.

Most jobs are followed by nobody, and most of the time nobody follows the feed either; yet every
event's push was built, packed and written to Redis, and Redis ran the script that found no
member: 30 % of a no-op job's run in a profile; without them its CPU in one process fell by 40 %
(bench/README.md, "Pushes only to followers"). So a job's events are pushed to its group only
while the job is marked followed, and status changes to the feed only while the feed is:

- **A job**: its row's `followed_until`. The web process that serves a stream of the job (a
  websocket, an SSE stream) joins the job's group, then marks the row (`groups_followed_mark`,
  called by `jobs.fanout.LocalFanout.follow`), and only then reads the job and its events. A move
  reads the mark in its own statement (`followed_returning`), on the row it updates. The row lock
  orders the two: a move that updated the row first has committed before the mark is written, so
  the stream's read finds its event; a move after the mark sees it and pushes. The stream's
  guarantee (every event, none twice, in order) is exactly what it was.
- **The feed**: one row of `FollowedGroup`, read by every move's statement. The feed has no
  backlog to read, so its guarantee is stated on the statements: a feed socket receives every
  status change whose statement started after the socket joined (the mark is committed before
  the join returns). A statement already running as it joined may or may not reach it, as a
  change written just before the join never did.

Marks are by the database's clock. One lasts `MARK_SECONDS`; each stream's open, and each web
process's fan-out at its renewals (every 30 s), write it again once fewer than
`REMARK_BELOW_SECONDS` remain: a followed job's row is written about once a minute, however many
streams follow it in however many processes (a statement that finds the mark fresh writes
nothing and takes no lock). A process that dies leaves its marks to run out: at worst a job's
events are pushed to nobody for two minutes. A mark that could not be written (the database
away) costs the stream pushes, not events: its periodic check (`jobs.streams`) reads them within
ten seconds.

PostgreSQL only: elsewhere nothing is marked and every event is pushed, as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import connections

from dbkit.per_connection import once_per_connection

FEED_GROUP = "jobs"  # the channel group of the feed of status changes
JOB_GROUP_PREFIX = "job."

MARK_SECONDS = 120  # how long a mark lasts
REMARK_BELOW_SECONDS = 90  # a mark with less left is written again; one with more is left as it is

# A new mark's end, and the end below which a mark is written again, as SQL.
_MARK_UNTIL = f"statement_timestamp() + interval '{MARK_SECONDS} seconds'"
_MARK_LACKING = f"statement_timestamp() + interval '{REMARK_BELOW_SECONDS} seconds'"

# Both flags true: what a statement that does not read the marks is taken to have found.
EVERYONE = (True, True)


def job_group(job_id: Any) -> str:
    """The channel group of one job's event stream: `job.<uuid hex>`."""
    hex_id = job_id.hex if hasattr(job_id, "hex") else str(job_id).replace("-", "")
    return f"{JOB_GROUP_PREFIX}{hex_id}"


def group_is_marked(group: str) -> bool:
    """Is a push to `group` sent only while it is marked followed (a job's group, the feed)?"""
    return group == FEED_GROUP or group.startswith(JOB_GROUP_PREFIX)


def _job_ids(groups: Iterable[str]) -> list[uuid.UUID]:
    return [uuid.UUID(hex=group[len(JOB_GROUP_PREFIX):]) for group in groups if group.startswith(JOB_GROUP_PREFIX)]


def groups_followed_mark(groups: Iterable[str], *, wait: bool = True) -> None:
    """Mark the jobs whose groups are among `groups`, and the feed if it is, as followed for the
    next `MARK_SECONDS` (those with more than `REMARK_BELOW_SECONDS` left are not written).

    `wait`: wait for a job's row lock (a move in progress), as the first mark of a stream must
    (its read comes after); else skip the rows locked now (a renewal, which has a minute of
    slack: waiting for several rows while a move waited for one of them could deadlock).
    Each statement commits on its own. A database error is raised."""
    groups = list(groups)
    from jobs.models import FollowedGroup, Job

    connection = connections[Job.objects.db]
    if connection.vendor != "postgresql":
        return
    job_ids = _job_ids(groups)
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        if job_ids:
            table, pk, column = quote(Job._meta.db_table), quote(Job._meta.pk.column), quote("followed_until")
            lacking = f"({column} IS NULL OR {column} < {_MARK_LACKING})"
            rows = (f"{pk} = ANY(%s) AND {lacking}" if wait else
                    f"{pk} IN (SELECT {pk} FROM {table} WHERE {pk} = ANY(%s) AND {lacking} FOR UPDATE SKIP LOCKED)")
            cursor.execute(f"UPDATE {table} SET {column} = {_MARK_UNTIL} WHERE {rows}", [job_ids])
        if FEED_GROUP in groups:
            table = quote(FollowedGroup._meta.db_table)
            cursor.execute(f"INSERT INTO {table} (name, until) VALUES (%s, {_MARK_UNTIL}) ON CONFLICT (name) DO UPDATE "
                           f"SET until = EXCLUDED.until WHERE {table}.until < {_MARK_LACKING}", [FEED_GROUP])


def followed_returning(connection) -> str:
    """What a job's UPDATE adds to its RETURNING list, on PostgreSQL: whether the job is followed
    and whether the feed is, as two more columns (`followed_job`, `followed_feed`), read in the
    move's own statement (built once per connection)."""
    def build() -> str:
        from jobs.models import Job

        column = connection.ops.quote_name(Job._meta.get_field("followed_until").column)
        return f", {column} > statement_timestamp() AS followed_job, {feed_followed(connection)} AS followed_feed"

    return once_per_connection(connection, "_taskplatform_followed_returning", build)


def feed_followed(connection) -> str:
    """An SQL expression: is the feed followed now? (An uncorrelated subquery: run once per
    statement.)"""
    def build() -> str:
        from jobs.models import FollowedGroup

        quote = connection.ops.quote_name
        return (f"EXISTS (SELECT 1 FROM {quote(FollowedGroup._meta.db_table)} WHERE name = '{FEED_GROUP}' "
                f"AND until > statement_timestamp())")

    return once_per_connection(connection, "_taskplatform_feed_followed", build)
