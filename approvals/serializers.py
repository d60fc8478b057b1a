"""The API's shapes of questions and answers."""

from __future__ import annotations

from rest_framework import serializers

from approvals.models import COMMENT_MAX_LENGTH, Decision, Question
from approvals.schemas import QuestionType
from jobs.serializers import (
    AnyJSONField,
    FieldsBuiltOnce,
    JSONObjectField,
    QuerySerializer,
    TextField,
    UUIDTextField,
)


class QuestionSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    """A question a job asked, as the API shows it."""

    job = serializers.UUIDField(source="job_id", read_only=True)
    schema = JSONObjectField(read_only=True, help_text="JSON Schema the answer must satisfy.")
    details = AnyJSONField(read_only=True, help_text="What the reviewer is shown with the prompt.")
    answer = AnyJSONField(read_only=True, allow_null=True)
    answered_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="Username of who answered; null when unanswered or answered by the system (a deadline's default).",
    )
    type = serializers.CharField(
        read_only=True, help_text=f"The question's type: {', '.join(QuestionType.LABELS)} (from its schema)."
    )
    assignees = serializers.SerializerMethodField(help_text="Who may answer: usernames and `group:name`s.")
    required_approvals = serializers.IntegerField(
        read_only=True, help_text="Distinct approvals that answer the question; any rejection answers it at once."
    )
    approvals = serializers.SerializerMethodField(help_text="Approving votes so far (in this round).")
    round = serializers.IntegerField(
        read_only=True, help_text="1, then 2, … each time the question is asked again (its votes count per round)."
    )
    asked_again_because = serializers.SerializerMethodField(
        help_text="Null in round 1; else why this round was opened: `reviewer_no_longer_allowed`, "
        "`policy_changed`, `approval_stale` (the last round's answer failed its check when the job used it), "
        "`previous_round_cancelled` or `previous_round_expired` (the job was retried)."
    )
    valid_for = serializers.FloatField(
        read_only=True, allow_null=True,
        help_text="Seconds an answer stays usable; an older one is not used and the question is asked again.",
    )

    class Meta:
        model = Question
        fields = [
            "id", "job", "key", "prompt", "type", "schema", "details", "status", "answer", "comment", "answered_by",
            "answered_at", "expires_at", "created_at", "assignees", "required_approvals", "approvals", "round",
            "asked_again_because", "valid_for",
        ]
        read_only_fields = fields

    def get_assignees(self, question: Question) -> list[str]:
        return question.assignee_names()

    def get_approvals(self, question: Question) -> int:
        counted = getattr(question, "approvals_in_round", None)  # read with the list (selectors.with_approvals)
        return question.approvals_so_far() if counted is None else counted

    def get_asked_again_because(self, question: Question) -> str | None:
        return question.asked_again_because or None


class AnswerSerializer(FieldsBuiltOnce, serializers.Serializer):
    """The body of `POST /api/questions/{id}/answer/`."""

    answer = AnyJSONField(allow_null=True, help_text="Any JSON; checked against the question's `schema`.")
    comment = TextField(required=False, allow_blank=True, default="", max_length=COMMENT_MAX_LENGTH)


class QuestionListQuerySerializer(QuerySerializer):
    """The filters of `GET /api/questions/`."""

    status = serializers.ChoiceField(choices=Question.Status.values, required=False)
    job = UUIDTextField(required=False, help_text="Only the questions of this job.")


class DecisionSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    """One row of a question's decision ledger."""

    question = serializers.UUIDField(source="question_id", read_only=True)
    job = serializers.UUIDField(source="job_id", read_only=True)
    actor = serializers.CharField(source="actor_name", read_only=True, help_text="Username, or `system`.")
    answer = AnyJSONField(read_only=True, allow_null=True)
    detail = JSONObjectField(read_only=True)

    class Meta:
        model = Decision
        fields = ["id", "question", "job", "round", "kind", "actor", "channel", "answer", "comment", "client_address",
                  "digest", "detail", "created_at"]
        read_only_fields = fields
