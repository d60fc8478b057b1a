"""One way to write a time in JSON, everywhere: as the REST API (DRF) writes it."""

from __future__ import annotations

from datetime import UTC, datetime

# The texts of the UTC times written last: a job's pushes write the same few times again and
# again (its `created_at` in every push, `updated_at` and `started_at` equal at its claim), and
# `isoformat` writes each field through C's printf. Cleared when full: it holds recent times only.
_WRITTEN_MAX = 256
_written: dict[datetime, str] = {}


def iso_utc(value: datetime | None) -> str | None:
    """ISO 8601 with UTC written `Z` (`2026-12-01T10:00:00.123456Z`), as DRF's DateTimeField does, so
    a time read from the API, a websocket, an SSE stream or a webhook compares equal as text."""
    if value is None:
        return None
    if value.tzinfo is not UTC:  # another zone, or naive: not kept
        return _written_as_drf(value)
    text = _written.get(value)
    if text is None:
        if len(_written) >= _WRITTEN_MAX:
            _written.clear()
        text = _written[value] = _written_as_drf(value)
    return text


def _written_as_drf(value: datetime) -> str:
    text = value.isoformat()
    return f"{text[:-6]}Z" if text.endswith("+00:00") else text
