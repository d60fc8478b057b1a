"""A job's wait on one piece of external work: what was handed out, how to wake it, when to look.

The row is the whole state of the wait, so any process (a new worker, beat, the web server that
takes a callback) can carry it on after a restart. The wake token is never stored: only its
SHA-256 (`token_hash`) and the salt it is derived from with the server's secret key (so a submit
retried after a transport failure hands out the same token, see `waits.services.wake_token`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q
from django.utils import timezone

from approvals.models import assignee_names
from jobs.models import Job


class Channel(models.TextChoices):
    """What ended a wait (or tried to): the first one wins."""

    CALLBACK = "callback"  # the service called back, and the check that followed found the result
    CHECK = "check"  # a backup check at a mark, a poll, or a check a person asked for
    PERSON = "person"  # a person provided the result, retried the submit or failed the wait
    DEADLINE = "deadline"  # the one deadline passed and its policy applied
    SYSTEM = "system"  # the platform: a budget spent, a runaway loop, the job cancelled


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
    # Not indexed on its own: the unique constraint of (job, key) starts with it (tests/test_indexes.py).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="waits", db_index=False)
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
    # What made the job runnable for its next look ("callback", "admin"; "" for a due mark), so that
    # the check that finds the result can say which channel ended the wait.
    woken_by = models.CharField(max_length=16, blank=True, default="")
    ended_by = models.CharField(max_length=16, choices=Channel.choices, blank=True, default="")
    ended_at = models.DateTimeField(null=True, blank=True)
    # A combined wait (`ctx.wait_for(..., person=Person(...))`): what the person is shown and the
    # JSON Schema of the result they may provide; null for a wait on the service alone.
    person = models.JSONField(null=True, blank=True)
    assigned_users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="assigned_waits")
    assigned_groups = models.ManyToManyField(Group, blank=True, related_name="assigned_waits")
    # What happens at `deadline_at` of a combined wait (approvals.policies.policy_to_json, with an
    # escalation's users and groups resolved); null: fail the job with `deadline_exceeded`.
    on_timeout = models.JSONField(null=True, blank=True)

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
            # beat's other question: which combined waits are past their one deadline?
            models.Index(
                fields=["deadline_at"], condition=Q(state__in=["submitting", "waiting"], person__isnull=False),
                name="wait_person_deadline",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} of job {str(self.job_id)[:8]} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE

    @property
    def has_person(self) -> bool:
        return self.person is not None

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON Schema of a result a person provides (what `approvals.forms` draws a form from)."""
        return (self.person or {}).get("schema") or {}

    def assignee_names(self) -> list[str]:
        """`["alice", "group:ops"]`: who may act for the person channel."""
        return assignee_names(self)


class AppendOnly(Exception):
    """A row of the waits' ledger was about to be changed or deleted: the ledger only grows."""


class WaitDecisionQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnly("wait decisions are never updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnly("wait decisions are never deleted")

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise AppendOnly("wait decisions are never updated")


class WaitDecision(models.Model):
    """One row of a wait's ledger: what ended it (a result found after a callback or a check, a
    person's result, retry or failure, the deadline's policy, the job cancelled), an escalation,
    or a person's action refused because something else came first. Never updated, never
    deleted (the model refuses and, on PostgreSQL, a trigger refuses too)."""

    class Kind(models.TextChoices):
        SUCCEEDED = "succeeded", "succeeded (the service's result)"
        PROVIDED = "provided", "result provided by a person"
        RETRIED = "retried", "submit retried by a person"
        FAILED = "failed"
        DEFAULTED = "defaulted", "default result (deadline)"
        ESCALATED = "escalated"
        CANCELLED = "cancelled"
        REFUSED = "refused", "refused (something else came first)"

    Channel = Channel

    id = models.BigAutoField(primary_key=True)
    # Not indexed on its own: the index of (wait, created_at) starts with it (tests/test_indexes.py).
    wait = models.ForeignKey(Wait, on_delete=models.PROTECT, related_name="decisions", db_index=False)
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="wait_decisions")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    # For a person: where they acted (admin, api, web).
    via = models.CharField(max_length=16, blank=True, default="")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="wait_decisions")
    actor_name = models.CharField(max_length=150, help_text="The actor's username then, or 'system'.")
    result = models.JSONField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    client_address = models.GenericIPAddressField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = WaitDecisionQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["wait", "created_at"], name="waitdecision_wait_created")]

    def __str__(self) -> str:
        return f"{self.kind} by {self.channel} ({self.actor_name})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnly("wait decisions are never updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnly("wait decisions are never deleted")
