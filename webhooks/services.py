"""Every write to webhooks and their deliveries goes through here (also for the system webhooks
that job kinds name for their questions: the same outbox, signing and retries).

A delivery is a row first: it is inserted in the transaction that moves the job into the status
it reports (an outbox), so a committed status change always has its deliveries and a rolled-back
one never does. Sending happens after the commit, one attempt per claim, retried with back-off
from the database's due times (not from long Celery countdowns).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dbkit.kept import KeptRead
from jobs.backoff import backoff_with_jitter
from jobs.clock import db_now, db_now_plus
from jobs.errors import InvalidInput
from jobs.models import Job
from jobs.timestamps import iso_utc
from webhooks.models import Webhook, WebhookDelivery
from webhooks.targets import (
    WebhookSendFailed,
    WebhookTargetRefused,
    WebhookTargetUnresolved,
    webhook_target_post,
    webhook_target_resolve,
    webhook_url_check,
)

logger = logging.getLogger(__name__)

EVENTS = frozenset(Webhook.Event.values)
SIGNATURE_HEADER = "X-Webhook-Signature"
TIMESTAMP_HEADER = "X-Webhook-Timestamp"
# A claimed attempt holds its delivery this long, so the sweep never sends it a second time
# while the first is still waiting for an answer.
CLAIM_LEASE_SECONDS = 120


def webhook_create(*, owner: Any, url: str, events: list[str]) -> Webhook:
    """Register `url` for `owner`'s jobs' `events`; the returned webhook carries its new secret.

    WebhookTargetRefused (field `url`) for a URL webhooks may not go to (`webhook_url_check`)."""
    webhook_url_check(url)
    unknown = sorted(set(events) - EVENTS)
    if unknown or not events:
        raise InvalidInput(
            f"events: {', '.join(unknown) or 'none given'}; choose from {', '.join(sorted(EVENTS))}", field="events"
        )
    return Webhook.objects.create(
        owner=owner, url=url, events=sorted(set(events)), secret=secrets.token_hex(32)
    )


def webhook_delete(*, webhook: Webhook) -> None:
    """Remove a webhook and its delivery log."""
    webhook.delete()


def webhook_sign(*, secret: str, timestamp: int, body: bytes) -> str:
    """`sha256=` and the hex HMAC-SHA256, keyed by `secret`, of `"{timestamp}." + body`.

    A receiver recomputes it over the raw body and the `X-Webhook-Timestamp` header, compares in
    constant time, and refuses old timestamps (a replay)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def _job_payload(job: Job) -> dict[str, Any]:
    # The API's own representation; DRF is imported here, not at the module's top, as this module
    # is imported in every process (the admin's actions) and only a worker's move with webhooks
    # to queue builds a payload (`taskplatform.celery.POOL_PRELOADED`).
    from rest_framework.renderers import JSONRenderer

    from jobs.serializers import JobSerializer

    return json.loads(JSONRenderer().render(JobSerializer(job).data))


# Every job that finishes, pauses or fails looks for its owner's webhooks: the statement is built
# once per connection (dbkit.kept). The stand-in is no user's id (ids start at 1).
_OWNERS_ACTIVE = KeptRead(lambda owner_id: Webhook.objects.filter(owner_id=owner_id, is_active=True), stand_ins=(-1,))


def webhook_deliveries_enqueue(
    *, job: Job, event: str, extra: dict[str, Any] | None = None, also: Iterable[Webhook] = ()
) -> list[WebhookDelivery]:
    """Queue a delivery of `event` about `job` for each of its owner's webhooks that want it, and
    for each webhook in `also` (system webhooks, such as a kind's `notify_webhook`).

    `extra` is merged into the payload (a question event carries the question). Precondition:
    the caller is in the transaction that made `event` happen; the first attempts are sent once
    it commits. Each is due at once by the database's clock (`jobs.clock`), which the attempt's
    claim and beat's sweep compare with; the payload's `created_at` is this host's, for people.
    """
    if event not in EVENTS:
        return []
    hooks: list[Webhook] = []
    if job.owner_id is not None:
        hooks = [h for h in _OWNERS_ACTIVE.rows(job.owner_id, using=Webhook.objects.db) if event in h.events]
    hooks += [hook for hook in also if hook.is_active]
    if not hooks:
        return []
    now = timezone.now()  # host clock: the payload's time, for the receiver's people and logs
    payload = {"event": f"job.{event}", "created_at": iso_utc(now), "job": _job_payload(job), **(extra or {})}
    deliveries = WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(webhook=hook, job_id=job.pk, event=event, payload=payload, next_attempt_at=db_now())
            for hook in hooks
        ]
    )
    ids = [str(delivery.pk) for delivery in deliveries]
    transaction.on_commit(lambda: _send_tasks(ids), robust=True)
    return deliveries


def webhook_system_get(*, url: str, events: Iterable[str]) -> Webhook | None:
    """The system webhook (no owner) for `url`, made on first use and signed with
    APPROVALS_WEBHOOK_SECRET; None (with a warning) while that setting is empty, because a
    receiver could not verify an unsigned delivery."""
    secret = settings.APPROVALS_WEBHOOK_SECRET
    if not secret:
        logger.warning("not sending to %s: set APPROVALS_WEBHOOK_SECRET to sign system webhooks", url)
        return None
    hook, created = Webhook.objects.get_or_create(
        owner=None, url=url, defaults={"events": sorted(set(events)), "secret": secret}
    )
    if not created and hook.secret != secret:  # the setting was rotated
        hook.secret = secret
        hook.save(update_fields=["secret"])
    return hook


def _send_tasks(ids: list[str]) -> None:
    from webhooks.tasks import webhook_delivery_attempt

    for delivery_id in ids:
        webhook_delivery_attempt.delay(delivery_id)


def delivery_retry_delay(attempt: int) -> float:
    """Seconds before attempt `attempt + 1`: exponential from WEBHOOK_RETRY_BASE, capped, with jitter."""
    return backoff_with_jitter(attempt, base=settings.WEBHOOK_RETRY_BASE, cap=settings.WEBHOOK_RETRY_MAX)


def webhook_deliver(*, delivery_id: Any) -> str:
    """Make one attempt at a due, pending delivery; return its status afterwards ("skipped" when
    it was not due or another process holds it).

    The host is resolved and checked first, and the POST goes to a checked address
    (`webhooks.targets`): a URL the policy refuses (a private address, unless
    WEBHOOKS_ALLOW_PRIVATE_NETWORKS) fails at once, with the reason, and is not retried. 2xx is
    delivered. Anything else (another status, a timeout, a refused connection, no DNS answer) is
    logged on the row and retried after `delivery_retry_delay`, until WEBHOOK_MAX_ATTEMPTS, then
    failed. Redirects are not followed. Due times are the database's (`jobs.clock`); the
    signature's timestamp is this host's, as the receiver checks it against its own clock.
    """
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=db_now()
    ).update(attempts=F("attempts") + 1, next_attempt_at=db_now_plus(CLAIM_LEASE_SECONDS))
    if not claimed:
        return "skipped"
    delivery = WebhookDelivery.objects.select_related("webhook").get(pk=delivery_id)
    hook = delivery.webhook
    if not hook.is_active:
        return _record(delivery, status_code=None, error="the webhook was disabled", final=True)

    body = json.dumps({"id": str(delivery.pk), **delivery.payload}, separators=(",", ":")).encode()
    timestamp = int(time.time())  # host clock: the receiver checks it against its own (replay window)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "taskplatform-webhooks",
        "X-Webhook-Event": f"job.{delivery.event}",
        "X-Webhook-Delivery": str(delivery.pk),
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: webhook_sign(secret=hook.secret, timestamp=timestamp, body=body),
    }
    try:
        target = webhook_target_resolve(url=hook.url)
    except WebhookTargetRefused as exc:
        # Our policy, not the receiver's state: trying again would be refused again.
        return _record(delivery, status_code=None, error=f"refused: {exc.message}"[:2000], final=True)
    except WebhookTargetUnresolved as exc:
        return _record(delivery, status_code=None, error=f"DNS: {exc}"[:2000])
    try:
        response = webhook_target_post(target=target, content=body, headers=headers,
                                       timeout=settings.WEBHOOK_TIMEOUT)
    except WebhookSendFailed as exc:
        return _record(delivery, status_code=None, error=str(exc)[:2000])
    if 200 <= response.status_code < 300:
        return _record(delivery, status_code=response.status_code, error="")
    if response.is_redirect:
        error = (f"HTTP {response.status_code}: redirect to {response.headers.get('Location', '')[:500]} not "
                 "followed; register the URL that answers")
    else:
        error = f"HTTP {response.status_code}: {response.text[:500]}"
    return _record(delivery, status_code=response.status_code, error=error)


def _record(delivery: WebhookDelivery, *, status_code: int | None, error: str, final: bool = False) -> str:
    fields: dict[str, Any] = {"response_status": status_code, "last_error": error}
    if not error:
        fields["status"], fields["delivered_at"] = WebhookDelivery.Status.DELIVERED, db_now()
    elif final or delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
        fields["status"] = WebhookDelivery.Status.FAILED
        logger.warning("webhook delivery %s failed for good after %d attempt(s): %s", delivery.pk,
                       delivery.attempts, error)
    else:
        fields["next_attempt_at"] = db_now_plus(delivery_retry_delay(delivery.attempts))
    WebhookDelivery.objects.filter(pk=delivery.pk, status=WebhookDelivery.Status.PENDING).update(**fields)
    return fields.get("status", WebhookDelivery.Status.PENDING)


def webhook_deliveries_send_due(*, limit: int = 500) -> int:
    """Send a task for each pending delivery that is due (a retry, or a first attempt whose task
    was lost). Run by beat; returns how many were sent."""
    from webhooks.tasks import webhook_delivery_attempt

    due = list(
        WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=db_now())
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    for delivery_id in due:
        webhook_delivery_attempt.delay(str(delivery_id))
    return len(due)


def webhook_delivery_retry_now(*, delivery: WebhookDelivery) -> None:
    """Make a delivery (even a failed one) due again at once, with one more attempt allowed."""
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=WebhookDelivery.Status.PENDING,
        next_attempt_at=db_now(),
        attempts=min(delivery.attempts, settings.WEBHOOK_MAX_ATTEMPTS - 1),
    )
