"""What the database can store as a job's JSON (a result, a step's checkpoint, an error).

`json.dumps` alone is not the test: it writes NaN and Infinity (not JSON, and PostgreSQL's
`jsonb` refuses them), and PostgreSQL also refuses a string holding a NUL character (`\\u0000`)
or half of a surrogate pair. A value that fails here would fail at the write, after the work was
done; checking first lets the run fail at once with a clear code instead.
"""

from __future__ import annotations

import json
from typing import Any


def json_refusal(value: Any) -> str | None:
    """Why `value` cannot be stored as JSON, or None when it can."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        reason = str(exc)
        if "Out of range float" in reason:
            reason = "NaN and Infinity are not JSON numbers"
        return reason
    except RecursionError:
        return "it is nested too deeply"
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            refusal = _text_refusal(item)
            if refusal:
                return refusal
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def _text_refusal(text: str) -> str | None:
    if "\x00" in text:
        return "a string holds a NUL character (\\u0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a string holds half of a surrogate pair, which is not valid Unicode"
    return None


def storable_text(text: str) -> str:
    """`text` with what the database cannot store (NUL, lone surrogates) written as escapes: for
    error messages, which quote whatever an exception said."""
    if _text_refusal(text) is None:
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
