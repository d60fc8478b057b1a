"""The API's shapes of jobs, job kinds and events, and the validation of requests and query
parameters. No business logic: the views hand validated data to `jobs.services`."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.validators import ProhibitNullCharactersValidator, RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.utils.serializer_helpers import BindingDict

from jobs.models import Job, JobEvent
from jobs.presenters import event_text, job_error_public
from jobs.timestamps import iso_utc

EVENTS_MAX_LIMIT = 1000

ORDERING_FIELDS = ("created_at", "updated_at", "started_at", "finished_at")
ORDERINGS = [*ORDERING_FIELDS, *(f"-{name}" for name in ORDERING_FIELDS)]

# PostgreSQL stores no NUL character, in text or in jsonb: a request carrying one is refused
# with a 400 naming the field, never a 500 from the database.
NUL_REFUSED = RegexValidator(
    r"\A[^\x00]*\Z", "may not contain the NUL character (U+0000)", code="null_characters_not_allowed"
)


def json_value_refusal(value: Any) -> str | None:
    """Why a parsed JSON value cannot be stored (a NUL character in a string or a key), or None.
    (DRF's JSONField already refuses numbers that are not finite.) Walks the value without
    recursion: its depth is the client's."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "may not contain the NUL character (U+0000) in any string"
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key:
                    return "may not contain the NUL character (U+0000) in any key"
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
    return None


class TextField(serializers.CharField):
    """A string of a request, taken as it was sent: a JSON string only (DRF's CharField turns a
    number into its text), not trimmed (so that the lengths in the schema are the lengths
    checked), and without the NUL character (said in the schema as a `pattern`)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        self.validators = [
            NUL_REFUSED if isinstance(validator, ProhibitNullCharactersValidator) else validator
            for validator in self.validators
        ]

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class RequestJSONField(serializers.JSONField):
    """JSON in a request: refused (400) when it cannot be stored (see `json_value_refusal`)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        refusal = json_value_refusal(value)
        if refusal is not None:
            raise serializers.ValidationError(refusal, code="invalid")
        return value


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(RequestJSONField):
    """A JSON object (a dict), in requests and in the schema."""

    default_error_messages = {"not_object": "must be a JSON object"}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_object")
        return value


@extend_schema_field({})
class AnyJSONField(RequestJSONField):
    """Any JSON value: object, array, string, number, boolean or null."""


UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# RFC 3339 `date-time` (what the schema's `format: date-time` means), letters in either case.
RFC3339 = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
    r"(?:\.(?P<fraction>[0-9]+))?(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<offset_hour>[0-9]{2}):(?P<offset_minute>[0-9]{2}))"
)


class WholeNumberField(serializers.IntegerField):
    """An integer of a query string, written in ASCII digits (what the schema's `integer` says):
    DRF's IntegerField also takes `1.0`, ` 1`, `+1`, `1_0` and the digits of other scripts."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str) and not re.fullmatch(r"-?[0-9]+", data):
            self.fail("invalid")
        return super().to_internal_value(data)


class UUIDTextField(serializers.UUIDField):
    """A UUID in its usual text (`format: uuid`): DRF's UUIDField also takes 32 hex digits, braces
    and URNs."""

    def to_internal_value(self, data: Any) -> Any:
        if not (isinstance(data, str) and UUID_TEXT.fullmatch(data)):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class InstantField(serializers.DateTimeField):
    """An RFC 3339 `date-time` of a query string, as the schema says: not the other ISO 8601
    forms Django's parser takes (`2020-01-01`, `20200101T0000`, a space for `T`). An instant
    outside what Python's datetime holds in UTC (`0001-01-01T00:00:00+01:00`) is taken as its
    nearest end, which filters the same; a leap second as the next second."""

    def to_internal_value(self, value: Any) -> datetime:
        match = RFC3339.fullmatch(value) if isinstance(value, str) else None
        try:
            if match is None:
                raise ValueError(value)
            second = int(match["second"])
            if second > 60:
                raise ValueError(value)
            local = datetime(
                *(int(part) for part in match["date"].split("-")), int(match["hour"]), int(match["minute"]),
                min(second, 59), int((match["fraction"] or "0")[:6].ljust(6, "0")),
            )
            offset = timedelta(hours=int(match["offset_hour"] or 0), minutes=int(match["offset_minute"] or 0))
            if offset >= timedelta(hours=24) or int(match["offset_minute"] or 0) > 59:
                raise ValueError(value)
        except ValueError:
            self.fail("invalid", format="RFC 3339, such as 2025-06-01T10:00:00Z")
        if match["sign"] == "-":
            offset = -offset
        try:
            utc = local - offset + timedelta(seconds=second - 59 if second == 60 else 0)
        except OverflowError:
            utc = datetime.min if offset > timedelta(0) else datetime.max
        return utc.replace(tzinfo=UTC)


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
    result_schema = JSONObjectField(
        allow_null=True, help_text="JSON Schema (2020-12) of a completed job's `result`, when the kind declares one."
    )


class JobProgressSerializer(serializers.Serializer):
    fraction = serializers.FloatField(min_value=0.0, max_value=1.0)
    text = serializers.CharField(allow_blank=True)


class JobErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="`exception`, `timeout`, `question_changed`, … or the job's own code.")
    message = serializers.CharField(allow_blank=True)

    def to_representation(self, instance: Any) -> Any:
        return super().to_representation(job_error_public(instance))


class FieldsBuiltOnce:
    """For a serializer whose fields do not depend on the request: they are worked out once per
    class, not for every response or request body.

    DRF builds a serializer's fields anew for each instance: it deep-copies the declared ones
    (each re-made from its arguments) and, for a ModelSerializer, builds the rest from the model.
    That was a seventh of the CPU of a `POST /api/jobs/`. Here `get_fields` runs once per class;
    each instance binds its own shallow copies of those fields (a nested serializer, which holds
    fields of its own, is still deep-copied).
    """

    @property
    def fields(self) -> BindingDict:
        bound = self.__dict__.get("_bound_fields")
        if bound is None:
            prototypes = type(self).__dict__.get("_field_prototypes")
            if prototypes is None:  # two threads may both build them: the same fields either way
                prototypes = self.get_fields()
                type(self)._field_prototypes = prototypes
            bound = self.__dict__["_bound_fields"] = BindingDict(self)
            for name, field in prototypes.items():
                nested = isinstance(field, serializers.BaseSerializer)
                bound[name] = copy.deepcopy(field) if nested else copy.copy(field)
        return bound


def _text(value: Any) -> str | None:
    """A CharField's output: `str`, and None for None."""
    return None if value is None else str(value)


def _number(value: Any) -> float | None:
    """A FloatField's output: `float`, and None for None."""
    return None if value is None else float(value)


class JobSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    """A job as the API shows it."""

    input = JSONObjectField(read_only=True)
    result = AnyJSONField(read_only=True, allow_null=True, help_text="What the job returned once `completed`.")
    error = JobErrorSerializer(read_only=True, allow_null=True, help_text="The last failure, if any.")
    progress = JobProgressSerializer(read_only=True)
    parent = serializers.UUIDField(
        source="parent_id", read_only=True, allow_null=True, help_text="The job that spawned this one, or null."
    )
    children = serializers.SerializerMethodField(help_text="The jobs this one spawned, oldest first.")

    class Meta:
        model = Job
        fields = [
            "id", "kind", "status", "input", "result", "error", "progress", "attempts", "max_attempts",
            "idempotency_key", "created_at", "updated_at", "started_at", "finished_at", "parent", "children",
        ]
        read_only_fields = fields

    def to_representation(self, job: Any) -> dict[str, Any]:
        """What DRF's field-by-field pass gives (tests/api/test_job_representation.py compares
        them on jobs of every shape), built in one step: that pass was 7 % of the web process's
        CPU per `POST /api/jobs/` (bench/README.md). A subclass, or anything but a job, takes
        DRF's pass."""
        if (type(self) is not JobSerializer or not isinstance(job, Job)
                or (job.error is not None and not (isinstance(job.error, dict) and job.error))):
            return super().to_representation(job)
        error = None if job.error is None else job_error_public(job.error)
        return {
            "id": str(job.pk),
            "kind": _text(job.kind),
            "status": _text(job.status),
            "input": job.input,
            "result": job.result,
            "error": None if error is None else {"code": _text(error["code"]), "message": _text(error["message"])},
            "progress": {"fraction": _number(job.progress_fraction), "text": _text(job.progress_text)},
            "attempts": job.attempts,
            "max_attempts": job.max_attempts,
            "idempotency_key": _text(job.idempotency_key),
            "created_at": iso_utc(job.created_at),
            "updated_at": iso_utc(job.updated_at),
            "started_at": iso_utc(job.started_at),
            "finished_at": iso_utc(job.finished_at),
            "parent": None if job.parent_id is None else str(job.parent_id),
            "children": self.get_children(job),
        }

    @extend_schema_field({"type": "array", "items": {"type": "string", "format": "uuid"}})
    def get_children(self, job: Job) -> list[str]:
        prefetched = getattr(job, "_prefetched_objects_cache", {}).get("children")
        rows = prefetched if prefetched is not None else job.children.only("id", "created_at")
        return [str(child.pk) for child in sorted(rows, key=lambda child: (child.created_at, str(child.pk)))]


class JobSubmitSerializer(FieldsBuiltOnce, serializers.Serializer):
    """The body of `POST /api/jobs/`."""

    kind = TextField(max_length=100, help_text="A registered kind (see `GET /api/job-kinds/`).")
    input = JSONObjectField(required=False, default=dict, help_text="Checked against the kind's `input_schema`.")
    idempotency_key = TextField(
        max_length=200,
        required=False,
        allow_null=True,
        help_text="Scoped to the caller: the same key with the same body returns the same job (200); "
        "with another body, 409.",
    )


class JobListQuerySerializer(QuerySerializer):
    """The filters of `GET /api/jobs/`."""

    status = serializers.ChoiceField(choices=Job.Status.values, required=False)
    kind = TextField(required=False, max_length=100)
    created_after = InstantField(required=False, help_text="Created at or after (RFC 3339).")
    created_before = InstantField(required=False, help_text="Created before (RFC 3339).")
    ordering = serializers.ChoiceField(choices=ORDERINGS, required=False, default="-created_at")


class JobEventSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
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

    after = WholeNumberField(
        required=False, default=0, min_value=0, max_value=2**31 - 1, help_text="Only events with a greater seq."
    )
    limit = WholeNumberField(
        required=False,
        default=EVENTS_MAX_LIMIT,
        min_value=1,
        max_value=EVENTS_MAX_LIMIT,
        help_text="At most this many (default and maximum 1000).",
    )
