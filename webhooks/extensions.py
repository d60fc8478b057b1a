"""What webhooks plugs into the jobs core (`jobs.extensions`), registered once at start-up by
`WebhooksConfig.ready()`: a status change that the owner's webhooks are told about queues its
deliveries in the transaction of the move, so a committed change always has them queued."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef

from jobs import extensions
from jobs.models import Job

# The statuses the owner's webhooks can be told about.
WEBHOOK_STATUSES = frozenset({Job.Status.COMPLETED, Job.Status.FAILED, Job.Status.PAUSED, Job.Status.CANCELLED})


def owner_has_webhooks() -> Exists:
    """Whether the job's owner has an active webhook: only then can a move have deliveries to
    queue. Read in the move's own statement, so that a job whose owner has none moves in that
    one statement, without a transaction or a look for its webhooks (`TransitionHook.needed_when`)."""
    from webhooks.models import Webhook

    return Exists(Webhook.objects.filter(owner_id=OuterRef("owner_id"), is_active=True))


def register() -> None:
    from webhooks.services import webhook_deliveries_enqueue

    @extensions.transition_hook(
        "webhooks.enqueue", statuses=WEBHOOK_STATUSES, owners_only=True, needed_when=owner_has_webhooks
    )
    def enqueue(*, job: Job, to: str, actor: Any, channel: str | None) -> None:
        webhook_deliveries_enqueue(job=job, event=to)
