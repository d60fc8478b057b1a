"""The API's shapes of webhooks and their deliveries."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers

from jobs.serializers import JSONObjectField, TextField
from webhooks.models import Webhook, WebhookDelivery
from webhooks.targets import WebhookTargetRefused, webhook_url_check

# The URLs Django's URL validator accepts, written for JSON Schema (ECMA 262) so that the schema
# says what the server accepts: a label is 1 to 63 characters and does not begin or end with a
# hyphen, the host (up to the port, path, query or fragment) is at most 253 characters, the top
# level is 2 to 63 letters (or punycode, `xn--`), a port is 0 to 65535, no whitespace. Names only, ASCII
# (IDN hosts in their `xn--` form): no user name or password, no `localhost`. IP addresses are
# accepted by the server too when they are public ones, which a pattern cannot say; they are
# left out of it so that nothing generated from the schema is refused for it.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_TOP = r"(?:[A-Za-z][A-Za-z-]{0,61}[A-Za-z]|[Xx][Nn]--[A-Za-z0-9]{1,59})"
_NOT_LOCALHOST = r"(?![Ll][Oo][Cc][Aa][Ll][Hh][Oo][Ss][Tt]\.?(?:[:/?#]|$))"
# (Said as "not 254 characters before the end of the host": generators skip a negative lookahead
# and filter, where a positive one would have them build its text first.)
_HOST_LENGTH = r"(?![^:/?#]{254})"
_PORT = r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|0[0-9]{4}|[0-9]{1,4}))?"
# Anything but NUL and what Python's `\s` (Django's validator) counts as whitespace, spelt out:
# ECMA's `\s` is another set (without U+001C to U+001F and U+0085, with U+FEFF).
_REST = r"(?:[/?#][^\x00\t-\r\x1c- \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*)?"


def webhook_url_pattern(*, https_only: bool | None = None) -> str:
    """The `pattern` of a webhook URL in the schema (see above); https only under
    WEBHOOKS_REQUIRE_HTTPS."""
    if https_only is None:
        https_only = settings.WEBHOOKS_REQUIRE_HTTPS
    scheme = r"[Hh][Tt][Tt][Pp][Ss]" if https_only else r"[Hh][Tt][Tt][Pp][Ss]?"
    return f"^{scheme}://{_HOST_LENGTH}(?:{_LABEL}\\.)+{_NOT_LOCALHOST}{_TOP}\\.?{_PORT}{_REST}$"


class WebhookUrlField(TextField):
    """A webhook's URL: Django's URL validator (here rather than in `validators`, where the schema
    generator would add `format: uri`, which refuses characters the server takes in a path), then
    the serializer's `webhooks.targets.webhook_url_check`."""

    default_error_messages = {"invalid": "Enter a valid URL."}

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            URLValidator()(value)
        except DjangoValidationError:
            self.fail("invalid")
        return value


class WebhookUrlFieldSchema(OpenApiSerializerFieldExtension):
    """Gives the schema of a webhook URL the limits the server applies (`webhook_url_pattern`)."""

    target_class = WebhookUrlField

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        return {**schema, "pattern": webhook_url_pattern()}


class WebhookSerializer(serializers.ModelSerializer):
    """A registered webhook (its secret is shown only in the answer that made it)."""

    # As registered: the server takes some characters in a path that `format: uri` does not.
    url = serializers.CharField(read_only=True, help_text="The URL deliveries are POSTed to.")
    events = serializers.ListField(child=serializers.ChoiceField(choices=Webhook.Event.choices), read_only=True)

    class Meta:
        model = Webhook
        fields = ["id", "url", "events", "is_active", "created_at"]
        read_only_fields = fields


class WebhookCreatedSerializer(WebhookSerializer):
    """A new webhook, with the secret that signs its deliveries: keep it, it is not shown again."""

    secret = serializers.CharField(read_only=True, help_text="HMAC-SHA256 key of `X-Webhook-Signature`.")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookCreateSerializer(serializers.Serializer):
    """The body of `POST /api/webhooks/`."""

    url = WebhookUrlField(
        max_length=2000,
        help_text="An http(s) URL that accepts POSTed JSON, on a public address: private, loopback and "
        "link-local ones are refused (when it is sent, too: its host's addresses are checked then). "
        "A host name, as the pattern says (a public IP address is accepted too).",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=Webhook.Event.choices),
        min_length=1,
        help_text="The job statuses to be told about, and `question` for questions that open.",
    )

    def validate_url(self, value: str) -> str:
        try:
            webhook_url_check(value)
        except WebhookTargetRefused as exc:
            raise serializers.ValidationError(exc.message) from None
        return value


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """One delivery: what was sent, and how it went."""

    job = serializers.UUIDField(source="job_id", read_only=True)
    payload = JSONObjectField(read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = [
            "id", "job", "event", "status", "attempts", "response_status", "last_error", "next_attempt_at",
            "created_at", "delivered_at", "payload",
        ]
        read_only_fields = fields
