"""Whether the credentials behind live streams still hold (registered with `jobs.streams`)."""

from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.contrib.auth import SESSION_KEY

from accounts.models import ApiToken


def tokens_still_valid(ids: set[str]) -> set[str]:
    """The ids of the API tokens (of `ids`) that are not revoked and whose user is active."""
    pks = [int(ident) for ident in ids if ident.isdigit()]
    active = ApiToken.objects.filter(pk__in=pks, revoked_at__isnull=True, user__is_active=True)
    return {str(pk) for pk in active.values_list("pk", flat=True)}


def sessions_still_valid(keys: set[str]) -> set[str]:
    """The session keys (of `keys`) whose session still exists, unexpired and signed in."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return {key for key in keys if key and SESSION_KEY in store(session_key=key).load()}
