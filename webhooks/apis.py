"""The webhooks API: a caller registers URLs for their own jobs' events and reads the delivery
log. A webhook belongs to its creator; anyone else gets 404."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.api_errors import RETRY_AFTER, error_responses
from jobs.api_lookups import ID, UUIDLookup
from jobs.errors import PlatformError
from webhooks.models import Webhook
from webhooks.serializers import (
    WebhookCreatedSerializer,
    WebhookCreateSerializer,
    WebhookDeliverySerializer,
    WebhookSerializer,
)
from webhooks.services import webhook_create, webhook_delete


class WebhookNotFound(PlatformError):
    code = "not_found"
    http_status = 404


def webhook_get_owned(*, user: object, webhook_id: str) -> Webhook:
    """The caller's webhook `webhook_id`; WebhookNotFound for anyone else's or none."""
    try:
        webhook = Webhook.objects.filter(owner=user, pk=webhook_id).first()
    except (ValueError, TypeError, ValidationError):
        webhook = None
    if webhook is None:
        raise WebhookNotFound(f"webhook {webhook_id} does not exist")
    return webhook


@extend_schema_view(
    list=extend_schema(
        summary="List the caller's webhooks",
        parameters=[RETRY_AFTER],
        responses={200: WebhookSerializer(many=True), **error_responses(400, 404)},
    ),
    retrieve=extend_schema(
        summary="Get a webhook",
        parameters=[ID, RETRY_AFTER],
        responses={200: WebhookSerializer, **error_responses(404)},
    ),
    create=extend_schema(
        summary="Register a webhook for the caller's jobs",
        description="Deliveries are POSTed as JSON with `X-Webhook-Timestamp` and `X-Webhook-Signature: "
        "sha256=<hex HMAC-SHA256 of \"{timestamp}.{body}\" keyed by the secret>`; anything but a 2xx is "
        "retried with back-off. The secret is in this answer only.",
        request=WebhookCreateSerializer,
        examples=[
            OpenApiExample(
                "Finished jobs",
                value={"url": "https://hooks.example.com/jobs", "events": ["completed", "failed"]},
                request_only=True,
            )
        ],
        parameters=[RETRY_AFTER],
        responses={201: WebhookCreatedSerializer, **error_responses(400)},
    ),
    destroy=extend_schema(
        summary="Remove a webhook and its delivery log",
        parameters=[ID, RETRY_AFTER],
        responses={204: OpenApiResponse(description="Removed."), **error_responses(404)},
    ),
)
class WebhookViewSet(UUIDLookup, viewsets.GenericViewSet):
    """Outgoing webhooks for job events: `completed`, `failed`, `paused`, `cancelled`, and `question` (one of
    the job's questions opened, was asked again or was escalated)."""

    serializer_class = WebhookSerializer

    def get_queryset(self) -> QuerySet[Webhook]:
        user = self.request.user
        return Webhook.objects.filter(owner=user) if user.is_authenticated else Webhook.objects.none()

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset().order_by("-created_at", "-pk"))
        return self.get_paginated_response(WebhookSerializer(page, many=True).data)

    def create(self, request: Request) -> Response:
        body = WebhookCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        webhook = webhook_create(owner=request.user, **body.validated_data)
        return Response(WebhookCreatedSerializer(webhook).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(WebhookSerializer(webhook_get_owned(user=request.user, webhook_id=pk)).data)

    def destroy(self, request: Request, pk: str) -> Response:
        webhook_delete(webhook=webhook_get_owned(user=request.user, webhook_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="webhooks_deliveries",
        summary="The webhook's deliveries, newest first",
        parameters=[ID, RETRY_AFTER],
        responses={200: WebhookDeliverySerializer(many=True), **error_responses(400, 404)},
    )
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str) -> Response:
        webhook = webhook_get_owned(user=request.user, webhook_id=pk)
        page = self.paginate_queryset(webhook.deliveries.order_by("-created_at", "-pk"))
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)
