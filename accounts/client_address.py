"""The client's IP address of a request, as far as it can be trusted.

`REMOTE_ADDR` is the peer that opened the connection: behind a proxy, the proxy. Each proxy
appends the address it received the request from to `X-Forwarded-For`, so with N proxies in
front (settings.TRUSTED_PROXY_COUNT) the client is the N-th address from the right. Anything
further left was written by the client and proves nothing: reading the left-most address, as
many do, lets any client choose the address recorded. Django's documentation gives the same
advice (`HttpRequest.META`, "X-Forwarded-For").
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings


def ip_address_or_none(value: str | None) -> str | None:
    """`value` as a normalised IP address, or None when it is empty or not an address."""
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


def client_address(request: Any) -> str | None:
    """The client's address: the right-most X-Forwarded-For hop past the trusted proxies, else the
    peer (REMOTE_ADDR). A chain shorter than the trusted proxies, or an entry that is not an
    address, falls back to the peer rather than to anything a client wrote."""
    meta = getattr(request, "META", None) or {}
    peer = ip_address_or_none(meta.get("REMOTE_ADDR"))
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies <= 0:
        return peer
    hops = [hop.strip() for hop in (meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if hop.strip()]
    if len(hops) < proxies:
        return peer
    return ip_address_or_none(hops[-proxies]) or peer
