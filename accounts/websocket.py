"""Websocket authentication: `?token=KEY` beside the session cookie, and the Origin check.

The ASGI stack is `OriginCheck(AuthMiddlewareStack(TokenAuthMiddleware(routes)))`: the session
sets `scope["user"]` first, and a valid `?token=` replaces it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from accounts.services import api_token_authenticate


@database_sync_to_async
def _user_for_token(key: str) -> Any:
    token = api_token_authenticate(key=key)
    return token.user if token is not None else AnonymousUser()


class TokenAuthMiddleware:
    """Authenticate a websocket by `?token=KEY` (an API token), for clients without a session.

    An invalid or revoked token makes the caller anonymous (so the consumer refuses it), even
    when a session cookie came along: a wrong credential is never silently replaced.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        query = parse_qs(scope.get("query_string", b"").decode("latin1"))
        keys = query.get("token")
        if keys:
            scope = dict(scope, user=await _user_for_token(keys[0]))
        return await self.app(scope, receive, send)


class BrowserOriginValidator(OriginValidator):
    """Channels' Origin check against ALLOWED_HOSTS, letting through clients that send none.

    The check exists against cross-site websocket hijacking, which needs a browser, and every
    browser sends `Origin` on a websocket. Scripts (the `websockets` package, curl) send none
    and authenticate with a token or a cookie of their own.
    """

    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        return self.validate_origin(parsed_origin)


def origin_checked(app: Any) -> BrowserOriginValidator:
    """Wrap `app` in the Origin check, allowing the hosts of ALLOWED_HOSTS."""
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(app, allowed)
