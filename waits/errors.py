"""Errors a caller of the waits can cause (mapped to HTTP by the API's one exception handler)."""

from jobs.errors import PlatformError


class WakeTokenInvalid(PlatformError):
    """Unknown, used or expired wake token. Deliberately the same answer for the three."""

    code = "not_found"
    http_status = 404


class WaitNotActive(PlatformError):
    """The wait has finished; there is nothing to check or cancel."""

    code = "invalid_transition"
    http_status = 409
