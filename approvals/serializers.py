"""The API's shapes of questions and answers."""

from __future__ import annotations

from rest_framework import serializers

from approvals.models import Question
from jobs.serializers import AnyJSONField, JSONObjectField, QuerySerializer


class QuestionSerializer(serializers.ModelSerializer):
    """A question a job asked, as the API shows it."""

    job = serializers.UUIDField(source="job_id", read_only=True)
    schema = JSONObjectField(read_only=True, help_text="JSON Schema the answer must satisfy.")
    details = AnyJSONField(read_only=True, help_text="What the reviewer is shown with the prompt.")
    answer = AnyJSONField(read_only=True, allow_null=True)
    answered_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Username of who answered."
    )

    class Meta:
        model = Question
        fields = [
            "id", "job", "key", "prompt", "schema", "details", "status", "answer", "comment", "answered_by",
            "answered_at", "expires_at", "created_at",
        ]
        read_only_fields = fields


class AnswerSerializer(serializers.Serializer):
    """The body of `POST /api/questions/{id}/answer/`."""

    answer = AnyJSONField(allow_null=True, help_text="Any JSON; checked against the question's `schema`.")
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000)


class QuestionListQuerySerializer(QuerySerializer):
    """The filters of `GET /api/questions/`."""

    status = serializers.ChoiceField(choices=Question.Status.values, required=False)
    job = serializers.UUIDField(required=False, help_text="Only the questions of this job.")
