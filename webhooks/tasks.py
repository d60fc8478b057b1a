"""Celery tasks of webhooks: thin, take an id, call a service."""

from celery import shared_task

from jobs.periodic import PeriodicPassTask
from webhooks.services import webhook_deliver, webhook_deliveries_send_due


@shared_task(name="webhooks.deliver", ignore_result=True)
def webhook_delivery_attempt(delivery_id: str) -> str:
    """One attempt at a delivery; a duplicate message finds it claimed and does nothing."""
    return webhook_deliver(delivery_id=delivery_id)


@shared_task(name="webhooks.send_due", base=PeriodicPassTask, ignore_result=True)
def webhooks_retry_due() -> int:
    """Run by beat: send the deliveries whose retry is due."""
    return webhook_deliveries_send_due()
