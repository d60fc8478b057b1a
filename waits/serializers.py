"""The API's shapes of waits, their ledger, and what a person sends to end one."""

from __future__ import annotations

from rest_framework import serializers

from jobs.serializers import AnyJSONField, JSONObjectField, QuerySerializer
from waits.models import Channel, Wait, WaitDecision


class WaitPersonSerializer(serializers.Serializer):
    """What a person standing in for the service is shown, and the schema of the result they give."""

    prompt = serializers.CharField()
    schema = JSONObjectField(help_text="JSON Schema the result a person provides must satisfy.")
    details = AnyJSONField()


class WaitSerializer(serializers.ModelSerializer):
    """A job's wait on outside work, as the API shows it."""

    job = serializers.UUIDField(source="job_id", read_only=True)
    person = WaitPersonSerializer(
        read_only=True, allow_null=True,
        help_text="Null for a wait on the service alone; else a combined wait that a person may end.",
    )
    assignees = serializers.SerializerMethodField(help_text="Who may act for the person channel.")
    next_check_at = serializers.DateTimeField(source="next_due_at", read_only=True, allow_null=True)
    deadline_at = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="Still pending then: its policy applies (a combined wait's one deadline, or the last mark).",
    )
    on_timeout = JSONObjectField(read_only=True, allow_null=True,
                                 help_text="A combined wait's deadline policy (`action`: default, fail, cancel, "
                                 "escalate); null: fail.")
    ended_by = serializers.CharField(
        read_only=True, help_text=f"What ended it: {', '.join(f'`{c}`' for c in Channel.values)}; empty while active.",
    )
    result = AnyJSONField(read_only=True, allow_null=True)
    error = JSONObjectField(read_only=True, allow_null=True)

    class Meta:
        model = Wait
        fields = ["id", "job", "key", "service", "mode", "state", "external_id", "person", "assignees",
                  "next_check_at", "deadline_at", "on_timeout", "checks", "ended_by", "ended_at", "result", "error",
                  "created_at", "updated_at"]
        read_only_fields = fields

    def get_assignees(self, wait: Wait) -> list[str]:
        return wait.assignee_names() if wait.has_person else []


class WaitDecisionSerializer(serializers.ModelSerializer):
    """One row of a wait's ledger."""

    wait = serializers.IntegerField(source="wait_id", read_only=True)
    job = serializers.UUIDField(source="job_id", read_only=True)
    actor = serializers.CharField(source="actor_name", read_only=True, help_text="Username, or `system`.")
    kind = serializers.CharField(read_only=True, help_text=", ".join(f"`{k}`" for k in WaitDecision.Kind.values))
    channel = serializers.CharField(read_only=True, help_text=", ".join(f"`{c}`" for c in Channel.values))
    via = serializers.CharField(read_only=True, help_text="Where a person acted: `admin`, `api`, `web`.")
    result = AnyJSONField(read_only=True, allow_null=True)
    detail = JSONObjectField(read_only=True)

    class Meta:
        model = WaitDecision
        fields = ["id", "wait", "job", "kind", "channel", "via", "actor", "result", "comment", "client_address",
                  "detail", "created_at"]
        read_only_fields = fields


class ProvideSerializer(serializers.Serializer):
    """The body of `POST /api/waits/{id}/provide/`."""

    result = AnyJSONField(allow_null=True, help_text="The result; checked against the wait's `person.schema`.")
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000)


class RetrySerializer(serializers.Serializer):
    """The body of `POST /api/waits/{id}/retry/` (may be empty)."""

    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000)


class FailSerializer(serializers.Serializer):
    """The body of `POST /api/waits/{id}/fail/`."""

    reason = serializers.CharField(max_length=5000, help_text="Why the wait fails (the job fails with it).")


class WaitListQuerySerializer(QuerySerializer):
    """The filters of `GET /api/waits/`."""

    job = serializers.UUIDField(required=False, help_text="Only the waits of this job.")
    state = serializers.ChoiceField(choices=Wait.State.values, required=False)
