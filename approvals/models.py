"""Questions that jobs ask people, and the append-only ledger of every decision about them."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q, Value
from django.db.models.functions import Now
from django.utils import timezone

from dbkit.kept import KeptRead
from jobs.models import Job

# The longest comment a reviewer may leave with an answer (the API, the admin, the job page).
COMMENT_MAX_LENGTH = 10_000
# Why a question was asked again (`Question.asked_again_because`), in words.
ASKED_AGAIN_REASONS = {
    "reviewer_no_longer_allowed": "a reviewer who approved is no longer allowed to answer",
    "policy_changed": "the job's code now asks it with other assignees, quorum or deadline",
    "approval_stale": "the answer was older than the question's valid_for when the job used it",
    "previous_round_cancelled": "the job was cancelled and retried",
    "previous_round_expired": "its deadline passed and the job was retried",
}


class Question(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        ANSWERED = "answered"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Not indexed on its own: the unique constraint of (job, key) starts with it (tests/test_indexes.py).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="questions", db_index=False)
    key = models.CharField(max_length=200, help_text="Names the question within its job; stable across runs.")
    prompt = models.TextField()
    schema = models.JSONField(help_text="JSON Schema the answer must satisfy.")
    details = models.JSONField(default=dict, blank=True, help_text="What the reviewer is shown with the prompt.")
    # sha256 of prompt, schema and details: what the reviewer saw (see approvals.runtime.question_digest).
    digest = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    answer = models.JSONField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    # Null on an answered question: the system answered it (a deadline's default).
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="answers"
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="The deadline; see on_timeout.")
    created_at = models.DateTimeField(auto_now_add=True)
    # Who may answer (besides holding the answer permission): these users and these groups' members.
    assigned_users = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="assigned_questions"
    )
    assigned_groups = models.ManyToManyField(Group, blank=True, related_name="assigned_questions")
    required_approvals = models.PositiveSmallIntegerField(
        default=1, help_text="Distinct approvals that answer the question; any rejection answers it at once."
    )
    # What beat does when expires_at passes (approvals.policies.policy_to_json); null: fail the job.
    on_timeout = models.JSONField(null=True, blank=True)
    # 1, then +1 each time a retried job asks a cancelled or expired question again; votes count per round.
    round = models.PositiveIntegerField(default=1)
    opened_at = models.DateTimeField(default=timezone.now, help_text="When the question (last) opened.")
    # sha256 of the policy the current round is asked under: assignees (as written), quorum, deadline
    # and its policy (see approvals.services.asking.question_policy_digest). Blank: asked before
    # policies had digests; such an answer is not re-checked against a policy.
    policy_digest = models.CharField(max_length=64, blank=True, default="")
    valid_for = models.FloatField(
        null=True, blank=True, help_text="Seconds an answer stays usable; older when the job uses it: asked again."
    )
    # Why this round was opened ("" in round 1): reviewer_no_longer_allowed, policy_changed,
    # approval_stale, previous_round_cancelled, previous_round_expired.
    asked_again_because = models.CharField(max_length=40, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        permissions = [("answer_question", "Can answer questions asked by jobs")]
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="question_unique_key_per_job"),
            models.CheckConstraint(
                condition=~Q(status="answered") | Q(answered_at__isnull=False),
                name="question_answered_has_time",
            ),
            models.CheckConstraint(condition=Q(required_approvals__gte=1), name="question_required_approvals_1"),
        ]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="question_status_created"),
            # Beat's look for due deadlines, and the inbox sorted by deadline.
            models.Index(fields=["status", "expires_at"], name="question_status_expires"),
        ]

    def __str__(self) -> str:
        return f"{self.prompt[:60]} ({self.status})"

    @property
    def type(self) -> str:
        from approvals.schemas import question_type

        return question_type(self.schema)

    def assignee_names(self) -> list[str]:
        """`["alice", "group:reviewers"]`: who may answer, as a job author writes it."""
        return assignee_names(self)

    def asked_again_text(self) -> str:
        """`"asked again (round 2), because …"`, or "" for a question in its first round."""
        if not self.asked_again_because:
            return ""
        reopened = self.decisions.filter(round=self.round, kind=Decision.Kind.REOPENED).order_by("-id").first()
        why = (reopened.comment if reopened is not None and reopened.comment else
               ASKED_AGAIN_REASONS.get(self.asked_again_because, self.asked_again_because))
        return f"asked again (round {self.round}), because {why}"

    def approvers(self) -> list[str]:
        """Usernames of the reviewers who approved in the current round, in the order they did."""
        rows = self.decisions.filter(round=self.round, kind=Decision.Kind.APPROVED).order_by("created_at", "id")
        return list(rows.values_list("actor_name", flat=True))

    def approvals_so_far(self) -> int:
        """Distinct approving votes in the current round."""
        return self.decisions.filter(round=self.round, kind=Decision.Kind.APPROVED).count()


class AppendOnly(Exception):
    """A decision was about to be changed or deleted: the ledger only grows."""


class DecisionQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnly("decisions are never updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnly("decisions are never deleted")

    # Bulk writes that would change rows.
    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise AppendOnly("decisions are never updated")


class Decision(models.Model):
    """One row of the decision ledger: an answer, a vote, an expiry, an escalation, a cancellation
    or a re-opening of a question. Never updated, never deleted (the model refuses, the admin is
    read-only, and on PostgreSQL a trigger refuses too); kept when the job is retried."""

    class Kind(models.TextChoices):
        ANSWERED = "answered", "answered"
        APPROVED = "approved", "approved (a vote)"
        REJECTED = "rejected", "rejected"
        EXPIRED = "expired", "expired"
        ESCALATED = "escalated", "escalated"
        CANCELLED = "cancelled", "cancelled"
        REOPENED = "reopened", "asked again"
        REFUSED = "refused", "refused (came too late)"

    class Channel(models.TextChoices):
        ADMIN = "admin"
        API = "api"
        WEB = "web"
        SYSTEM = "system"

    id = models.BigAutoField(primary_key=True)
    # Neither indexed on its own: the indexes of (question, round, kind) and (job, created_at)
    # start with them (tests/test_indexes.py).
    question = models.ForeignKey(Question, on_delete=models.PROTECT, related_name="decisions", db_index=False)
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="decisions", db_index=False)
    round = models.PositiveIntegerField(default=1)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # Null: the system (a deadline, a job cancelled without a person).
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="decisions"
    )
    actor_name = models.CharField(max_length=150, help_text="The actor's username then, or 'system'.")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    answer = models.JSONField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    client_address = models.GenericIPAddressField(null=True, blank=True)
    # The question's digest when this was decided: what the reviewer was shown.
    digest = models.CharField(max_length=64)
    detail = models.JSONField(default=dict, blank=True)
    # The database's clock (`jobs.clock`): a vote's age is judged by it when the job uses it (valid_for).
    created_at = models.DateTimeField(db_default=Now(), db_index=True)

    objects = DecisionQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # Distinct approvals: one approving vote per reviewer per round of a question.
            models.UniqueConstraint(
                fields=["question", "round", "actor"], condition=Q(kind="approved"), name="decision_one_vote"
            ),
        ]
        indexes = [
            models.Index(fields=["question", "round", "kind"], name="decision_question_round"),
            models.Index(fields=["job", "created_at"], name="decision_job_created"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor_name} ({self.channel})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnly("decisions are never updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnly("decisions are never deleted")


def _assignees(model: type[models.Model], pk: Any) -> models.QuerySet:
    """The usernames and group names assigned to `model`'s row `pk`, as (name, "user" | "group")."""
    rows = []
    for relation, kind, name in [("assigned_users", "user", get_user_model().USERNAME_FIELD),
                                 ("assigned_groups", "group", "name")]:
        field = model._meta.get_field(relation)
        links = field.remote_field.through.objects.filter(**{f"{field.m2m_field_name()}_id": pk})
        rows.append(links.annotate(kind=Value(kind)).order_by()
                    .values_list(f"{field.m2m_reverse_field_name()}__{name}", "kind"))
    return rows[0].union(rows[1], all=True)


_ASSIGNEE_READS: dict[type[models.Model], KeptRead] = {}


def assignee_names(row: models.Model) -> list[str]:
    """`["alice", "group:reviewers"]` for a row with `assigned_users` and `assigned_groups` (a
    question, a wait): from what was prefetched, else one statement built once per connection
    (dbkit.kept): an answer's response shows it."""
    prefetched = getattr(row, "_prefetched_objects_cache", {})
    if "assigned_users" in prefetched and "assigned_groups" in prefetched:
        users = [user.get_username() for user in row.assigned_users.all()]
        groups = [group.name for group in row.assigned_groups.all()]
    else:
        model = type(row)
        read = _ASSIGNEE_READS.get(model)
        if read is None:
            stand_in = uuid.UUID(int=0) if isinstance(model._meta.pk, models.UUIDField) else -1
            read = _ASSIGNEE_READS[model] = KeptRead(partial(_assignees, model), stand_ins=(stand_in,))
        found = read.rows(row.pk, using=model.objects.db)
        users = [name for name, kind in found if kind == "user"]
        groups = [name for name, kind in found if kind == "group"]
    return sorted(users) + [f"group:{name}" for name in sorted(groups)]
