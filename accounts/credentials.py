"""The credentials behind live streams: whether they still hold, and news of a revoked one.

A live stream (a websocket, an SSE stream) stands on the credential it opened with: `("token",
"<ApiToken pk>")` for an API token (directly, or through a websocket ticket asked for with it),
`("session", "<session key>")` for a browser session. The registry of live streams
(`jobs.streams`) re-checks them with `credentials_still_valid`, and closes a token's streams at
once when `credential_revoked` is sent (`api_token_revoke` sends it once the revocation commits).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib import import_module

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.dispatch import Signal

from accounts.models import ApiToken

logger = logging.getLogger(__name__)

# Sent with `kind` and `id` (a str) after a credential was revoked (its transaction committed).
credential_revoked = Signal()


def tokens_still_valid(ids: set[str]) -> set[str]:
    """The ids of the API tokens (of `ids`) that are not revoked and whose user is active."""
    pks = [int(ident) for ident in ids if ident.isdigit()]
    active = ApiToken.objects.filter(pk__in=pks, revoked_at__isnull=True, user__is_active=True)
    return {str(pk) for pk in active.values_list("pk", flat=True)}


def sessions_still_valid(keys: set[str]) -> set[str]:
    """The session keys (of `keys`) whose session still exists, unexpired and signed in."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return {key for key in keys if key and SESSION_KEY in store(session_key=key).load()}


_KINDS: dict[str, Callable[[set[str]], set[str]]] = {"token": tokens_still_valid, "session": sessions_still_valid}


def credentials_still_valid(kind: str, ids: set[str]) -> set[str]:
    """The ids of `kind` that are still good; none for an unknown kind."""
    check = _KINDS.get(kind)
    if check is None:
        logger.warning("no check for credentials of kind %r: refusing them", kind)
        return set()
    return check(ids)
