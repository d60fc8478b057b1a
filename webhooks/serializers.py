"""The API's shapes of webhooks and their deliveries."""

from __future__ import annotations

from rest_framework import serializers

from jobs.serializers import JSONObjectField
from webhooks.models import Webhook, WebhookDelivery
from webhooks.targets import WebhookTargetRefused, webhook_url_check


class WebhookSerializer(serializers.ModelSerializer):
    """A registered webhook (its secret is shown only in the answer that made it)."""

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

    url = serializers.URLField(
        max_length=2000,
        help_text="An http(s) URL that accepts POSTed JSON, on a public address: private, loopback and "
        "link-local ones are refused (when it is sent, too: its host's addresses are checked then).",
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
