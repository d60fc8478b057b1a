"""The waits' ledger: one row for whatever ended a wait (and its channel), an escalation, and a
person's action refused because something else came first.

Rows are only ever inserted (`WaitDecision` refuses updates and deletes; on PostgreSQL a trigger
does too), in the transaction of the change they record.
"""

from __future__ import annotations

from typing import Any

from accounts.client_address import ip_address_or_none
from waits.models import Wait, WaitDecision


def wait_decision_record(
    *,
    wait: Wait,
    kind: str,
    channel: str,
    actor: Any = None,
    via: str = "",
    result: Any = None,
    comment: str = "",
    client_address: str | None = None,
    detail: dict[str, Any] | None = None,
) -> WaitDecision:
    """Append one row to the ledger of `wait`. `actor` None is the system (or the service).

    Precondition: the caller is in the transaction that makes the change.
    """
    return WaitDecision.objects.create(
        wait_id=wait.pk,
        job_id=wait.job_id,
        kind=kind,
        channel=channel,
        via=via or "",
        actor=actor,
        actor_name=actor.get_username() if actor is not None else "system",
        result=result,
        comment=(comment or "")[:5000],
        client_address=ip_address_or_none(client_address),
        detail=detail or {},
    )

