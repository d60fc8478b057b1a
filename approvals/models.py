"""Questions that jobs ask people."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from jobs.models import Job


class Question(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        ANSWERED = "answered"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="questions")
    key = models.CharField(max_length=200, help_text="Names the question within its job; stable across runs.")
    prompt = models.TextField()
    schema = models.JSONField(help_text="JSON Schema the answer must satisfy.")
    details = models.JSONField(default=dict, blank=True, help_text="What the reviewer is shown with the prompt.")
    # sha256 of prompt, schema and details: what the reviewer saw (see jobs.runtime.question_digest).
    digest = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    answer = models.JSONField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="answers"
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("answer_question", "Can answer questions asked by jobs")]
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="question_unique_key_per_job"),
            models.CheckConstraint(
                condition=~Q(status="answered") | Q(answered_at__isnull=False),
                name="question_answered_has_time",
            ),
        ]
        indexes = [models.Index(fields=["status", "-created_at"], name="question_status_created")]

    def __str__(self) -> str:
        return f"{self.prompt[:60]} ({self.status})"
