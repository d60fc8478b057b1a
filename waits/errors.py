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


class WaitEnded(PlatformError):
    """A person acted on a wait that something else already ended; the message says what, and when."""

    code = "wait_ended"
    http_status = 409


class WaitBusy(PlatformError):
    """A person acted while the job is not parked on the wait: a callback, a backup check or
    another person woke it first, and it is looking at the service now. Try again if it parks."""

    code = "wait_busy"
    http_status = 409


class NotAllowedToAct(PlatformError):
    """The user may not act for the person channel of this wait (the rule of questions)."""

    code = "not_allowed"
    http_status = 403


class InvalidResult(PlatformError):
    """A result provided by a person that breaks the wait's schema (`field` names where)."""

    code = "invalid_result"


class WaitNotFound(PlatformError):
    code = "not_found"
    http_status = 404
