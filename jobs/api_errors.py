"""The one place where errors become HTTP responses, and the shapes of those responses.

Every 4xx body is `{"code", "detail", "field"?}`: `code` is stable (documented in the README),
`detail` says what was wrong and what to do, `field` names the request field that failed (a
dotted path such as `input.seconds`) when there is one. A 400 from request validation also
carries `errors`, every failing field with its messages.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, OpenApiTypes
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.errors import PlatformError

NON_FIELD_KEYS = {"non_field_errors", "__all__"}


class ErrorSerializer(serializers.Serializer):
    """An error: a stable code, a sentence for people, and the field it concerns."""

    code = serializers.CharField(help_text="Stable machine-readable error code, e.g. `invalid_transition`.")
    detail = serializers.CharField(help_text="What was wrong and what to do.")
    field = serializers.CharField(required=False, help_text="The request field that failed (dotted path).")


class ValidationErrorSerializer(ErrorSerializer):
    """A request that failed validation: the first failing field, and all of them."""

    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Every failing field (dotted path) with its messages.",
    )


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """{"input": {"seconds": ["bad"]}} → {"input.seconds": ["bad"]} (lists index as numbers)."""
    if isinstance(detail, dict):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = "" if key in NON_FIELD_KEYS else str(key)
            flat.update(_flatten(value, f"{prefix}.{name}".strip(".") if name else prefix))
        return flat
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return {prefix: [str(item) for item in detail]}
        flat = {}
        for index, item in enumerate(detail):
            flat.update(_flatten(item, f"{prefix}.{index}".strip(".")))
        return flat
    return {prefix: [str(detail)]}


def validation_error_body(exc: exceptions.ValidationError) -> dict[str, Any]:
    """The 400 body of a DRF ValidationError, naming the first failing field."""
    errors = {name: messages for name, messages in _flatten(exc.detail).items() if messages}
    field, messages = next(iter(errors.items()), ("", ["invalid request"]))
    body: dict[str, Any] = {"code": "invalid", "detail": f"{field}: {messages[0]}" if field else messages[0]}
    if field:
        body["field"] = field
    body["errors"] = {name or "request": messages for name, messages in errors.items()}
    return body


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """REST_FRAMEWORK's EXCEPTION_HANDLER: PlatformError at its own status, DRF's errors in the
    same shape. Anything else propagates (a 500 is a bug, not an answer)."""
    if isinstance(exc, PlatformError):
        response = Response(exc.as_dict(), status=exc.http_status)
        retry_after = getattr(exc, "retry_after", None)
        if retry_after:  # a 503 that is worth retrying (jobs.errors.Busy)
            response["Retry-After"] = str(retry_after)
        return response
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    # DRF's own handler sets the headers: WWW-Authenticate on 401, Retry-After on 429.
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    if isinstance(exc, exceptions.ValidationError):
        response.data = validation_error_body(exc)
    else:
        code = exc.detail.code if isinstance(exc.detail, exceptions.ErrorDetail) else exc.default_code
        response.data = {"code": str(code or exc.default_code), "detail": str(exc.detail)}
    return response


RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    OpenApiTypes.INT,
    location=OpenApiParameter.HEADER,
    response=[429],
    description="Seconds to wait before the next request.",
)

_DESCRIPTIONS = {
    400: "The request is invalid; `field` names the first failing field.",
    401: "No valid credentials (`Authorization: Token <key>` or a session).",
    403: "The caller may see this but not do this.",
    404: "Not found, or not visible to the caller.",
    409: "The request conflicts with the current state.",
    429: "Too many requests for this token; wait `Retry-After` seconds.",
}


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """The documented error responses of an operation; 401 and 429 apply to every one."""
    result: dict[int, OpenApiResponse] = {}
    for status in sorted({*statuses, 401, 429}):
        serializer = ValidationErrorSerializer if status == 400 else ErrorSerializer
        result[status] = OpenApiResponse(serializer, description=_DESCRIPTIONS[status])
    return result
