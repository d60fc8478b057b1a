"""The decision ledger: one row per answer, vote, expiry, escalation, cancellation or re-opening.

Rows are only ever inserted (`Decision` refuses updates and deletes; on PostgreSQL a trigger
does too), in the transaction of the change they record.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connections
from django.http import HttpRequest

from accounts.client_address import client_address as _client_address
from accounts.client_address import ip_address_or_none
from approvals.models import Decision, Question
from dbkit.inserts import kept_insert, returned_into
from dbkit.per_connection import once_per_connection
from dbkit.prepared import prepared_fetch
from dbkit.values import lookup_preparer, prepared_checked, save_preparer


def decision_record(
    *,
    question: Question,
    kind: str,
    actor: Any = None,
    channel: str,
    answer: Any = None,
    comment: str = "",
    client_address: str | None = None,
    detail: dict[str, Any] | None = None,
    settles: bool = False,
) -> Decision:
    """Append one row to the ledger for `question` as it is now (its round and digest).

    `settles`: the row decides the question. Its fields that a decision writes (`SETTLED_FIELDS`:
    status, answer, comment, answered_by), as the caller set them on `question`, are written with
    the row, and its `answered_at` is the row's `created_at` (the database's clock): on PostgreSQL
    in the same statement as the row's INSERT.

    Precondition: the caller is in the transaction that makes the change, holding the question's
    row lock. `actor` None is the system.
    """
    decision = Decision(
        question=question,
        job_id=question.job_id,
        round=question.round,
        kind=kind,
        actor=actor,
        actor_name=actor.get_username() if actor is not None else "system",
        channel=channel,
        answer=answer,
        comment=comment or "",
        client_address=ip_address_or_none(client_address),
        digest=question.digest,
        detail=detail or {},
    )
    using = Decision.objects.db
    connection = connections[using]
    # The INSERT kept per connection (`dbkit.inserts`) and, when it settles the question, the
    # question's UPDATE as a CTE beside it: the ORM's two saves were a fifth of an answer's time
    # in the web process (bench/README.md, "An answer's writes in one statement").
    meta = Decision._meta
    returning = [meta.pk, meta.get_field("created_at")]
    check = settings.KEPT_READS_CHECK
    kept = None
    if connection.vendor == "postgresql":
        kept = kept_insert(connection, decision, _written(), returning, check=check)
    if kept is None:  # elsewhere (SQLite), or a value that is an expression: the ORM's two saves
        decision.save(force_insert=True)
        if settles:
            question.answered_at = decision.created_at
            question.save(update_fields=[*SETTLED_FIELDS, "answered_at"])
        return decision
    insert_sql, params = kept
    sql = insert_sql
    if settles:
        sql, settling = _settling(connection, insert_sql)
        for field, prepare, value in zip(settling.fields, settling.preparers,
                                         [getattr(question, name) for name in settling.attnames], strict=True):
            params.append(prepared_checked(field, prepare, value, connection) if check else prepare(value, connection))
        params.append(settling.pk(question.pk, connection))
    row = prepared_fetch(connection, sql, params, one=True)
    if settles and row[-1] != 1:  # the caller holds the question's lock: it is there
        raise AssertionError(f"question {question.pk} was not updated with its decision")
    returned_into(decision, returning, row[:2], connection, using)
    if settles:
        question.answered_at = decision.created_at
    return decision


# The fields of a question that its deciding row writes (with its `answered_at`).
SETTLED_FIELDS = ("status", "answer", "comment", "answered_by")


@cache
def _written() -> list:
    """The ledger row's columns an INSERT writes: all but its id and its time (the database's)."""
    meta = Decision._meta
    return [field for field in meta.local_concrete_fields
            if field is not meta.pk and field.attname != "created_at" and not field.generated]


@dataclass(frozen=True)
class _Settling:
    sql: str
    attnames: tuple[str, ...]
    fields: tuple
    preparers: tuple
    pk: Any


def _settling(connection: Any, insert_sql: str) -> tuple[str, _Settling]:
    """The ledger row's INSERT with the question's UPDATE beside it, returning the row's id, its
    `created_at` and the number of questions updated (1); built once per connection."""
    def build() -> _Settling:
        quote = connection.ops.quote_name
        meta = Question._meta
        fields = tuple(meta.get_field(name) for name in SETTLED_FIELDS)
        sets = ", ".join(f"{quote(field.column)} = %s" for field in fields)
        sql = (f"WITH d AS ({insert_sql}), q AS (UPDATE {quote(meta.db_table)} SET {sets}, "
               f"{quote(meta.get_field('answered_at').column)} = (SELECT d.{quote('created_at')} FROM d) "
               f"WHERE {quote(meta.pk.column)} = %s RETURNING 1) "
               f"SELECT d.{quote('id')}, d.{quote('created_at')}, (SELECT count(*) FROM q) FROM d")
        return _Settling(sql=sql, attnames=tuple(field.attname for field in fields), fields=fields,
                         preparers=tuple(save_preparer(field, connection) for field in fields),
                         pk=lookup_preparer(meta.pk, connection))

    kept = once_per_connection(connection, "_approvals_settling", dict)
    found = kept.get(insert_sql)
    if found is None:
        found = kept[insert_sql] = build()
    return found.sql, found


def request_client_address(request: HttpRequest | Any) -> str | None:
    """The client's IP address for the ledger (see `accounts.client_address`: X-Forwarded-For
    only past TRUSTED_PROXY_COUNT proxies, read from the right)."""
    return _client_address(request)
