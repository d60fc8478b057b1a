"""A throttle on the admin's sign-in, against password guessing.

Every failed `authenticate()` with a request (Django's `user_login_failed` signal) counts, in the
cache (Redis, shared by every web process), against the pair (client address, username) and
against the address alone. Once the pair reaches LOGIN_FAILURE_LIMIT, or the address four times
that (one address trying many names), a sign-in from that address for that name (or any name)
is answered 429 without checking the password, until LOGIN_LOCKOUT_SECONDS after the last
failure. A successful sign-in clears its pair. Counting by address and name, never by name alone,
keeps a stranger from locking a real user out from elsewhere. The address is
`jobs.client_address` (TRUSTED_PROXY_COUNT).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from jobs.client_address import client_address

ADDRESS_FACTOR = 4


def _keys(request: HttpRequest, username: str) -> tuple[str, str]:
    address = client_address(request) or "unknown"
    name = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    return f"login-failures:{address}:{name}", f"login-failures:{address}"


def _count_up(key: str) -> None:
    timeout = settings.LOGIN_LOCKOUT_SECONDS
    if not cache.add(key, 1, timeout=timeout):
        try:
            cache.incr(key)
        except ValueError:  # expired between the two calls
            cache.add(key, 1, timeout=timeout)
        cache.touch(key, timeout)  # the lock-out runs from the last failure


def login_locked_out(request: HttpRequest, username: str) -> bool:
    """True when sign-ins for `username` from this request's address are refused for now."""
    pair, address = _keys(request, username)
    limit = settings.LOGIN_FAILURE_LIMIT
    counts = cache.get_many([pair, address])
    return counts.get(pair, 0) >= limit or counts.get(address, 0) >= limit * ADDRESS_FACTOR


@receiver(user_login_failed)
def _count_failure(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    if request is None:
        return
    for key in _keys(request, str(credentials.get("username", ""))):
        _count_up(key)


@receiver(user_logged_in)
def _clear_failures(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if request is not None:
        cache.delete(_keys(request, user.get_username())[0])


def admin_login(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    """The admin's login view behind the throttle (mounted at /admin/login/ before the admin)."""
    if request.method == "POST" and login_locked_out(request, request.POST.get("username", "")):
        minutes = max(1, round(settings.LOGIN_LOCKOUT_SECONDS / 60))
        request.method = "GET"  # draw the form again; the password is not checked
        response = admin.site.login(request, extra_context={
            "login_throttled": f"Too many failed sign-ins from your address: try again in {minutes} minutes.",
        })
        response.status_code = 429
        response["Retry-After"] = str(settings.LOGIN_LOCKOUT_SECONDS)
        return response
    return admin.site.login(request, **kwargs)
