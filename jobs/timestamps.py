"""One way to write a time in JSON, everywhere: as the REST API (DRF) writes it."""

from __future__ import annotations

from datetime import UTC, datetime

# The texts of the times written last: a job's pushes write the same few times again and again
# (its `created_at` in every push, `updated_at` and `started_at` equal at its claim). Cleared
# when full, so it holds only recent times.
_WRITTEN_MAX = 256
_written: dict[datetime, str] = {}


def iso_utc(value: datetime | None) -> str | None:
    """ISO 8601 with UTC written `Z` (`2026-12-01T10:00:00.123456Z`), as DRF's DateTimeField does, so
    a time read from the API, a websocket, an SSE stream or a webhook compares equal as text."""
    if value is None:
        return None
    if value.tzinfo is not UTC:  # another zone, or naive: as `isoformat` writes it
        text = value.isoformat()
        return f"{text[:-6]}Z" if text.endswith("+00:00") else text
    text = _written.get(value)
    if text is None:
        # What `isoformat` writes (no fraction when the microseconds are 0) and DRF turns `+00:00`
        # into, without `isoformat`'s C printf for each field (a tenth of a push's cost).
        text = "%04d-%02d-%02dT%02d:%02d:%02d" % (value.year, value.month, value.day, value.hour, value.minute,
                                                  value.second)
        text = f"{text}.{value.microsecond:06d}Z" if value.microsecond else f"{text}Z"
        if len(_written) >= _WRITTEN_MAX:
            _written.clear()
        _written[value] = text
    return text
