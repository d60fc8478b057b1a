"""One way to write a time in JSON, everywhere: as the REST API (DRF) writes it."""

from __future__ import annotations

from datetime import datetime


def iso_utc(value: datetime | None) -> str | None:
    """ISO 8601 with UTC written `Z` (`2026-12-01T10:00:00.123456Z`), as DRF's DateTimeField does, so
    a time read from the API, a websocket, an SSE stream or a webhook compares equal as text."""
    if value is None:
        return None
    text = value.isoformat()
    return f"{text[:-6]}Z" if text.endswith("+00:00") else text
