"""The decision ledger: one row per answer, vote, expiry, escalation, cancellation or re-opening.

Rows are only ever inserted (`Decision` refuses updates and deletes; on PostgreSQL a trigger
does too), in the transaction of the change they record.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from accounts.client_address import client_address as _client_address
from accounts.client_address import ip_address_or_none
from approvals.models import Decision, Question


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
) -> Decision:
    """Append one row to the ledger for `question` as it is now (its round and digest).

    Precondition: the caller is in the transaction that makes the change, holding the question's
    row lock. `actor` None is the system.
    """
    return Decision.objects.create(
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



def request_client_address(request: HttpRequest | Any) -> str | None:
    """The client's IP address for the ledger (see `accounts.client_address`: X-Forwarded-For
    only past TRUSTED_PROXY_COUNT proxies, read from the right)."""
    return _client_address(request)
