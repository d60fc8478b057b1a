"""The API's shapes of jobs, job kinds and events, and the validation of requests and query
parameters. No business logic: the views hand validated data to `jobs.services`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import Job, JobEvent
from jobs.presenters import event_text

EVENTS_MAX_LIMIT = 1000

ORDERING_FIELDS = ("created_at", "updated_at", "started_at", "finished_at")
ORDERINGS = [*ORDERING_FIELDS, *(f"-{name}" for name in ORDERING_FIELDS)]


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    """A JSON object (a dict), in requests and in the schema."""

    default_error_messages = {"not_object": "must be a JSON object"}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_object")
        return value


@extend_schema_field({})
class AnyJSONField(serializers.JSONField):
    """Any JSON value: object, array, string, number, boolean or null."""


class QuerySerializer(serializers.Serializer):
    """Validates query parameters. A parameter given empty (`?status=`) is refused like any other
    bad value, rather than read as "not given" (DRF's rule for HTML forms)."""

    def to_internal_value(self, data: Any) -> Any:
        blank = {name: ["may not be empty; leave the parameter out instead"]
                 for name in self.fields if name in data and data.get(name) == ""}
        if blank:
            raise serializers.ValidationError(blank)
        return super().to_internal_value(data)


class JobKindSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    input_schema = JSONObjectField(help_text="JSON Schema (2020-12) that a job's `input` must satisfy.")


class JobProgressSerializer(serializers.Serializer):
    fraction = serializers.FloatField(min_value=0.0, max_value=1.0)
    text = serializers.CharField(allow_blank=True)


class JobErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="`exception`, `timeout`, `question_changed`, … or the job's own code.")
    message = serializers.CharField(allow_blank=True)


class JobSerializer(serializers.ModelSerializer):
    """A job as the API shows it."""

    input = JSONObjectField(read_only=True)
    result = AnyJSONField(read_only=True, allow_null=True, help_text="What the job returned once `completed`.")
    error = JobErrorSerializer(read_only=True, allow_null=True, help_text="The last failure, if any.")
    progress = JobProgressSerializer(read_only=True)

    class Meta:
        model = Job
        fields = [
            "id", "kind", "status", "input", "result", "error", "progress", "attempts", "max_attempts",
            "idempotency_key", "created_at", "updated_at", "started_at", "finished_at",
        ]
        read_only_fields = fields


class JobSubmitSerializer(serializers.Serializer):
    """The body of `POST /api/jobs/`."""

    kind = serializers.CharField(max_length=100, help_text="A registered kind (see `GET /api/job-kinds/`).")
    input = JSONObjectField(required=False, default=dict, help_text="Checked against the kind's `input_schema`.")
    idempotency_key = serializers.CharField(
        max_length=200,
        required=False,
        allow_null=True,
        help_text="Scoped to the caller: the same key with the same body returns the same job (200); "
        "with another body, 409.",
    )


class JobListQuerySerializer(QuerySerializer):
    """The filters of `GET /api/jobs/`."""

    status = serializers.ChoiceField(choices=Job.Status.values, required=False)
    kind = serializers.CharField(required=False, max_length=100)
    created_after = serializers.DateTimeField(required=False, help_text="Created at or after (ISO 8601).")
    created_before = serializers.DateTimeField(required=False, help_text="Created before (ISO 8601).")
    ordering = serializers.ChoiceField(choices=ORDERINGS, required=False, default="-created_at")


class JobEventSerializer(serializers.ModelSerializer):
    """One entry of a job's event log."""

    step = serializers.CharField(allow_null=True, help_text="The step or question key, for those types.")
    status = serializers.CharField(allow_null=True, help_text="See the event types in the README.")
    message = JSONObjectField()
    text = serializers.SerializerMethodField(
        help_text="The event as one short sentence for people (`3 % · step 1 of 30`); pages show it.")

    class Meta:
        model = JobEvent
        fields = ["seq", "type", "step", "status", "message", "created_at", "text"]
        read_only_fields = fields

    def get_text(self, instance: JobEvent) -> str:
        return event_text({"type": instance.type, "step": instance.step, "status": instance.status,
                           "message": instance.message})

    def to_representation(self, instance: JobEvent) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["step"] = data["step"] or None
        data["status"] = data["status"] or None
        return data


class JobEventsQuerySerializer(QuerySerializer):
    """`?after=SEQ&limit=N` of `GET /api/jobs/{id}/events/`."""

    after = serializers.IntegerField(
        required=False, default=0, min_value=0, max_value=2**31 - 1, help_text="Only events with a greater seq."
    )
    limit = serializers.IntegerField(
        required=False,
        default=EVENTS_MAX_LIMIT,
        min_value=1,
        max_value=EVENTS_MAX_LIMIT,
        help_text="At most this many (default and maximum 1000).",
    )
