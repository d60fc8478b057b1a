"""Websocket authentication: a session cookie or a `?ticket=`; never an API key in the URL.

The ASGI stack is `OriginCheck(AuthMiddlewareStack(TicketAuthMiddleware(routes)))`: the session
sets `scope["user"]` first, then this middleware looks at the query string:

- `?ticket=T` (from `POST /api/ws-tickets/`, `accounts.tickets`): the ticket's user, once; an
  unknown, used or expired ticket makes the caller anonymous, even with a session cookie (a
  wrong credential is never silently replaced), and the consumer refuses the socket;
- `?token=KEY` is refused the same way: an API key in a URL ends up in access logs;
- neither: the session's user, if any.

It also says which credential the socket stands on (`scope["credential"]`: `("token", id)` for a
ticket asked for with an API token, `("session", key)` for a session), so that the registry of
live streams (`jobs.streams`) can re-check it and close the socket when it is revoked, and why a
caller was refused (`scope["auth_refused"]`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from accounts.tickets import ws_ticket_redeem

TOKEN_IN_URL = "API keys are not accepted in URLs: POST /api/ws-tickets/ for a ticket and connect with ?ticket="
BAD_TICKET = "unknown, used or expired ticket: POST /api/ws-tickets/ for a new one"


class TicketAuthMiddleware:
    """Authenticate a websocket by `?ticket=` (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        query = parse_qs(scope.get("query_string", b"").decode("latin1"))
        if "token" in query:
            scope = dict(scope, user=AnonymousUser(), auth_refused=TOKEN_IN_URL)
        elif "ticket" in query:
            redeemed = await database_sync_to_async(ws_ticket_redeem)(ticket=query["ticket"][0])
            if redeemed is None:
                scope = dict(scope, user=AnonymousUser(), auth_refused=BAD_TICKET)
            else:
                scope = dict(scope, user=redeemed[0], credential=redeemed[1])
        else:
            user, session = scope.get("user"), scope.get("session")
            if user is not None and user.is_authenticated and session is not None:
                scope = dict(scope, credential=("session", session.session_key or ""))
        return await self.app(scope, receive, send)


class BrowserOriginValidator(OriginValidator):
    """Channels' Origin check against ALLOWED_HOSTS, letting through clients that send none.

    The check exists against cross-site websocket hijacking, which needs a browser, and every
    browser sends `Origin` on a websocket. Scripts (the `websockets` package, curl) send none
    and authenticate with a ticket or a cookie of their own.
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
