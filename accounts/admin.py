"""API tokens in the admin: listed by prefix with their last use, revocable, and creatable with
the key shown once (only its hash is stored).

A key acts as its user, so making one for somebody else is impersonating them: staff with
`add_apitoken` make keys for themselves only, and only superusers choose the user. Revoking
needs `change_apitoken`; viewing the list does not allow it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.models import ApiToken
from accounts.services import api_token_create, api_token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix_display", "user", "name", "created_at", "last_used_at", "revoked_at", "active")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "created_at")
    search_fields = ("prefix", "name", "user__username")
    list_select_related = ("user",)
    autocomplete_fields = ("user",)
    actions = ("revoke_selected",)

    @admin.display(description="token", ordering="prefix")
    def prefix_display(self, token: ApiToken) -> str:
        return f"{token.prefix}…"

    @admin.display(description="active", boolean=True)
    def active(self, token: ApiToken) -> bool:
        return token.is_active

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        if obj is None:
            # Only a superuser picks whose key it is; anyone else makes their own.
            return ["user", "name"] if request.user.is_superuser else ["name"]
        return ["prefix_display", "user", "name", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        if obj is None:
            return []
        return ["prefix_display", "user", "created_at", "last_used_at", "revoked_at"]

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["name"])
            return
        if not request.user.is_superuser:
            if obj.user_id not in (None, request.user.pk):
                raise PermissionDenied("only a superuser may make a key for another user")
            obj.user = request.user
        token, key = api_token_create(user=obj.user, name=obj.name)
        # The admin goes on with `obj` (its log entry, its redirect): make it the created row.
        obj.pk, obj.key_hash, obj.prefix, obj.created_at = token.pk, token.key_hash, token.prefix, token.created_at
        messages.warning(
            request,
            f"The key of token {token.prefix}… for {token.user} is: {key} — copy it now, it is not shown again.",
        )

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = 0
        for token in queryset.filter(revoked_at__isnull=True):
            api_token_revoke(token=token)
            count += 1
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
