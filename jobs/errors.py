"""The family of errors a caller can cause. The API's exception handler (`jobs.api_errors`) maps
them to HTTP once. `PlatformError` is the root that every app's errors share (`approvals.errors`,
`waits.errors`, `webhooks.targets`); it lives here because every feature app stands on `jobs`.

Each carries a stable `code` (documented in the README) and a message that says what was wrong
and what to do.
"""

from __future__ import annotations


class PlatformError(Exception):
    """Base of every error a user or a caller can cause."""

    code = "error"
    http_status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict:
        body = {"code": self.code, "detail": self.message}
        if self.field:
            body["field"] = self.field
        return body


class UnknownKind(PlatformError):
    code = "unknown_kind"


class InvalidInput(PlatformError):
    code = "invalid_input"


class JobNotFound(PlatformError):
    code = "not_found"
    http_status = 404


class InvalidTransition(PlatformError):
    code = "invalid_transition"
    http_status = 409


class IdempotencyConflict(PlatformError):
    code = "idempotency_conflict"
    http_status = 409


class NotAllowed(PlatformError):
    """The caller may see the object but not do this to it (for example cancel another's job)."""

    code = "not_allowed"
    http_status = 403


class ClaimDeferred(InvalidTransition):
    """The job is pending but may not be claimed yet: it is in its retry back-off (an early
    duplicate message), or an earlier run of it is still alive (a cancelled run still winding
    down when a person retried the job). `retry_in` seconds from now the claim can succeed (the
    back-off is over, the old run's lease has run out)."""

    def __init__(self, message: str, *, retry_in: float, kind: str) -> None:
        super().__init__(message)
        self.retry_in = retry_in
        self.kind = kind


class Busy(PlatformError):
    """The request lost a race for the database again and again (a deadlock, a serialization
    failure) although it was retried: nothing was changed, send it again shortly."""

    code = "busy"
    http_status = 503
    retry_after = 1
