"""The API's JSON parser: DRF's, with a size limit and a nesting limit before parsing.

A body longer than REQUEST_BODY_MAX_BYTES is a 413 (`request_too_large`), without reading past the
limit; nesting deeper than JSON_MAX_DEPTH is a 400 (`parse_error`) like any other bad JSON.
DRF reads the request stream itself, so Django's DATA_UPLOAD_MAX_MEMORY_SIZE never applies here.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers, status
from rest_framework.settings import api_settings
from rest_framework.utils import json as drf_json

from jobs.json_input import json_parse


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"
    default_detail = "the request body is too large"


def request_too_large() -> RequestTooLarge:
    limit = settings.REQUEST_BODY_MAX_BYTES
    return RequestTooLarge(f"the request body is larger than {limit} bytes; send less (REQUEST_BODY_MAX_BYTES)")


class BoundedJSONParser(parsers.JSONParser):
    """JSONParser with the platform's limits on size and depth."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        parser_context = parser_context or {}
        limit = settings.REQUEST_BODY_MAX_BYTES
        request = parser_context.get("request")
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0) if request is not None else 0
        except ValueError:
            declared = 0
        if declared > limit:
            raise request_too_large()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise request_too_large()
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = raw.decode(encoding)
            constant = drf_json.strict_constant if api_settings.STRICT_JSON else None
            return json_parse(text, parse_constant=constant)
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from exc
