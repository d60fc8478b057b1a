"""A job's wait on one piece of external work: what was handed out, how to wake it, when to look.

The row is the whole state of the wait, so any process (a new worker, beat, the web server that
takes a callback) can carry it on after a restart. The wake token is never stored: only its
SHA-256 (`token_hash`) and the salt it is derived from with the server's secret key (so a submit
retried after a transport failure hands out the same token, see `waits.services.wake_token`).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from jobs.models import Job


class Wait(models.Model):
    class State(models.TextChoices):
        SUBMITTING = "submitting", "submitting (not yet accepted)"
        WAITING = "waiting", "waiting (accepted; parked)"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Mode(models.TextChoices):
        CALLBACK = "callback", "callback (backup checks at marks)"
        POLL = "poll", "polling (exponential back-off)"

    ACTIVE = frozenset({State.SUBMITTING, State.WAITING})

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="waits")
    key = models.CharField(max_length=200, help_text="Names the wait within its job; stable across runs.")
    service = models.CharField(max_length=200, blank=True, default="")
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.CALLBACK)
    policy = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.SUBMITTING)
    external_id = models.CharField(max_length=500, blank=True, default="")
    # The token is HMAC(SECRET_KEY, salt); the database holds the salt and the token's SHA-256.
    token_salt = models.CharField(max_length=64)
    token_hash = models.CharField(max_length=64, unique=True)
    token_used_at = models.DateTimeField(null=True, blank=True)
    # A wake (callback, admin) that no check has consumed yet.
    woken_at = models.DateTimeField(null=True, blank=True)
    checks = models.PositiveIntegerField(default=0, help_text="Calls of `check` that reached the service.")
    throttle_bounces = models.PositiveIntegerField(default=0, help_text="Answers of 429 so far.")
    transport_failures = models.PositiveIntegerField(
        default=0, help_text="Transport failures in a row (starts again when a call reaches the service)."
    )
    transport_failures_total = models.PositiveIntegerField(default=0)
    executions = models.PositiveIntegerField(default=0, help_text="Runs of the job through this wait.")
    accepted_at = models.DateTimeField(null=True, blank=True)
    next_due_at = models.DateTimeField(null=True, blank=True, help_text="When beat resumes the job for a look.")
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="Still pending after this: it fails.")
    last_checked_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="wait_unique_key_per_job"),
            models.CheckConstraint(
                condition=Q(state__in=["submitting", "waiting", "succeeded", "failed", "cancelled"]),
                name="wait_state_known",
            ),
        ]
        indexes = [
            # beat's question, every second or two: which active waits are due?
            models.Index(
                fields=["next_due_at"], condition=Q(state__in=["submitting", "waiting"]), name="wait_active_due"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} of job {str(self.job_id)[:8]} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE
