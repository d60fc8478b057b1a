"""Webhooks and their delivery log in the admin: who registered what, and how each delivery went."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from webhooks.models import Webhook, WebhookDelivery
from webhooks.services import webhook_delivery_retry_now


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ("url", "owner", "events", "is_active", "created_at")
    list_filter = ("is_active",)
    search_fields = ("url", "owner__username")
    list_select_related = ("owner",)
    fields = ("id", "owner", "url", "events", "is_active", "created_at")
    readonly_fields = ("id", "owner", "url", "events", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # made through the API, which shows the secret once


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("created_at", "event", "job", "webhook", "status", "attempts", "response_status",
                    "next_attempt_at", "delivered_at")
    list_filter = ("status", "event")
    search_fields = ("=job__id", "webhook__url")
    list_select_related = ("webhook", "job")
    actions = ("retry_now",)
    readonly_fields = ("id", "webhook", "job", "event", "status", "attempts", "response_status", "last_error",
                       "next_attempt_at", "created_at", "delivered_at", "payload")
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: WebhookDelivery | None = None) -> bool:
        return False

    def has_resend_permission(self, request: HttpRequest) -> bool:
        """Sending again makes the workers call out: more than viewing. The webhook's change
        permission (the deliveries themselves are read-only)."""
        return request.user.has_perm("webhooks.change_webhook")

    @admin.action(description="Send the selected deliveries again now", permissions=["resend"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        for delivery in queryset:
            webhook_delivery_retry_now(delivery=delivery)
        self.message_user(request, f"{queryset.count()} delivery(ies) are due again; beat sends them shortly.",
                          messages.SUCCESS)
