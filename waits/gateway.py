"""Calling an outside service over HTTP in the terms `ctx.wait_for` understands.

`service_request` turns the transport's ways of failing into the two exceptions a wait knows:
a 429 becomes `Throttled(Retry-After)`, and a timeout, a connection reset, a 5xx or a body that
is not JSON becomes `TransportError` (retried a bounded number of times). Any other answer is
returned as (status, JSON body) for the caller to judge.
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from waits.policy import Throttled, TransportError


def retry_after_seconds(value: str | None, default: float = 1.0) -> float:
    """A `Retry-After` header (seconds or an HTTP date) as seconds from now."""
    if not value:
        return default
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max((parsedate_to_datetime(value) - timezone.now()).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return default


def service_request(method: str, url: str, *, json: Any = None, headers: dict[str, str] | None = None,
                    timeout: float | None = None) -> tuple[int, Any]:
    """One HTTP call to an outside service; see the module's docstring for what it raises."""
    import httpx  # here: job kinds import this module in every process, only a job's call sends

    try:
        response = httpx.request(method, url, json=json, headers=headers,
                                 timeout=timeout if timeout is not None else settings.WAITS_HTTP_TIMEOUT)
    except httpx.TransportError as exc:  # timeouts, refused and reset connections, protocol errors
        raise TransportError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code == 429:
        raise Throttled(retry_after_seconds(response.headers.get("Retry-After")))
    if response.status_code >= 500:
        raise TransportError(f"{method} {url}: HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError as exc:
        raise TransportError(f"{method} {url}: HTTP {response.status_code} with a body that is not JSON") from exc
    return response.status_code, body
