"""JSON that comes from outside (request bodies, form fields), bounded before it is parsed.

Python's json parser recurses once per level of nesting and raises RecursionError past about a
thousand levels: not a ValueError, so it escapes every `except ValueError` (DRF's parser among
them) as a 500. `json_parse` measures the nesting first, on the brackets outside strings, and
refuses anything deeper than JSON_MAX_DEPTH with `JsonTooDeep`, a ValueError.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from django.conf import settings

# A JSON string (the unrolled form: linear, no backtracking), and everything but a bracket.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonTooDeep(ValueError):
    """The document nests arrays and objects deeper than allowed."""


def json_depth_check(text: str, limit: int | None = None) -> None:
    """Raise JsonTooDeep when `text` opens more than `limit` (default JSON_MAX_DEPTH) arrays or
    objects at once. Unbalanced text is measured the same way (the parser then refuses it)."""
    limit = settings.JSON_MAX_DEPTH if limit is None else limit
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if len(brackets) <= limit:
        return  # cannot be deeper than the number of brackets
    if max(accumulate(map(_STEP.__getitem__, brackets))) > limit:
        raise JsonTooDeep(f"JSON nested deeper than {limit} levels")


def json_parse(text: str | bytes, **kwargs: Any) -> Any:
    """`json.loads(text)` after the depth check: raises ValueError (JSONDecodeError, JsonTooDeep)
    for anything that is not acceptable JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    json_depth_check(text)
    return json.loads(text, **kwargs)
