"""Outgoing webhooks: URLs a caller registers for their jobs' events (and the system webhooks of job
kinds for their questions), and every delivery."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from jobs.models import Job
from webhooks.targets import webhook_url_validate


class Webhook(models.Model):
    class Event(models.TextChoices):
        COMPLETED = "completed"
        FAILED = "failed"
        PAUSED = "paused"
        CANCELLED = "cancelled"
        # A question of the job opened (or was asked again, or escalated); see approvals.
        QUESTION = "question"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # None: a system webhook, configured in code (a job kind's `notify_webhook`), signed with
    # APPROVALS_WEBHOOK_SECRET; it is not listed in the API.
    # Not indexed on its own: the index of (owner, is_active) starts with it (tests/test_indexes.py).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="webhooks",
        db_index=False,
    )
    # The validator refuses what webhooks may not be sent to (`webhooks.targets`) in every form of
    # the model; deliveries check again, after resolving the host.
    url = models.URLField(max_length=2000, validators=[webhook_url_validate])
    # Which job statuses are delivered: a subset of Event.
    events = models.JSONField(default=list)
    # The HMAC-SHA256 key of the signatures. Kept in clear because signing needs it; shown to the
    # caller once, when the webhook is made.
    secret = models.CharField(max_length=64, editable=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "is_active"], name="webhook_owner_active")]

    def __str__(self) -> str:
        return f"{self.url} ({', '.join(self.events)})"


class WebhookDelivery(models.Model):
    """One event for one webhook: its payload, and how sending it went."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="webhook_deliveries")
    event = models.CharField(max_length=16, choices=Webhook.Event.choices)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # When a pending delivery may next be tried; a claimed attempt pushes it out by a lease.
    next_attempt_at = models.DateTimeField()
    response_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_status_due")]

    def __str__(self) -> str:
        return f"{self.event} of {self.job_id} to {self.webhook_id} ({self.status})"
