"""Websocket tickets: a short-lived, single-use credential for one websocket connection.

An API key must never appear in a URL (URLs end up in access logs, proxies and browser
history). A client that authenticates with its key (or a session) asks `POST /api/ws-tickets/`
for a ticket and connects with `?ticket=`. The ticket is good for one connection and expires
after `WS_TICKET_TTL` seconds (at most 60). Django's cache (Redis, shared by every web process,
and following a master through Sentinels) holds only its SHA-256, with what it stands for: the
user and the credential that asked for it, so that revoking that token (or ending that session)
closes the streams opened with its tickets too (`accounts.credentials`).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.utils import timezone

from accounts.credentials import credentials_still_valid


def _key(ticket: str) -> str:
    return f"wsticket:{hashlib.sha256(ticket.encode()).hexdigest()}"


def ws_ticket_issue(*, user: Any, credential: tuple[str, str]) -> tuple[str, datetime]:
    """A new ticket for `user`, standing for `credential`; returns it and when it expires."""
    ticket = secrets.token_urlsafe(32)
    ttl = max(1, min(int(settings.WS_TICKET_TTL), 60))
    cache.set(_key(ticket), {"user": user.pk, "credential": list(credential)}, timeout=ttl)
    return ticket, timezone.now() + timedelta(seconds=ttl)


def ws_ticket_redeem(*, ticket: str) -> tuple[Any, tuple[str, str]] | None:
    """The (active) user and the credential a ticket stands for, or None when it is unknown,
    used, expired, or its credential was revoked since. A ticket is redeemed once: of two
    connections that read it at the same time, only the one whose delete removed it gets it."""
    key = _key(ticket)
    data = cache.get(key)
    if data is None or not cache.delete(key):
        return None
    kind, ident = data["credential"]
    user = get_user_model().objects.filter(pk=data["user"], is_active=True).first()
    if user is None or ident not in credentials_still_valid(kind, {ident}):
        return None
    return user, (kind, ident)
