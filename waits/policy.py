"""What a job author hands to `ctx.wait_for`: the policy, the outcome of a check, and the two
exceptions a `submit` or `check` may raise.

    from waits.policy import CheckResult, Throttled, TransportError, WaitPolicy
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings


class Throttled(Exception):  # noqa: N818 (what the service said, not an error of ours)
    """The service answered 429: try again after `retry_after` seconds (its `Retry-After`)."""

    def __init__(self, retry_after: float = 1.0) -> None:
        super().__init__(f"throttled; retry after {retry_after}s")
        self.retry_after = max(float(retry_after), 0.0)


class TransportError(Exception):
    """The service could not be reached or answered something unusable: a timeout, a reset, a
    5xx, a body that does not parse. Retried a bounded number of times."""


@dataclass(frozen=True)
class CheckResult:
    """What `check(external_id)` returns: `pending`, `succeeded` with the result, or `failed`."""

    state: str
    result: Any = None
    reason: str = ""
    # Optional progress of a pending piece of work (0..1, a short text), shown as job progress.
    progress: float | None = None
    text: str = ""

    @classmethod
    def pending(cls, progress: float | None = None, text: str = "") -> CheckResult:
        return cls("pending", progress=progress, text=text)

    @classmethod
    def succeeded(cls, result: Any) -> CheckResult:
        return cls("succeeded", result=result)

    @classmethod
    def failed(cls, reason: str) -> CheckResult:
        return cls("failed", reason=str(reason))


def _default_marks() -> tuple[float, ...]:
    return tuple(float(mark) for mark in settings.WAITS_DEFAULT_MARKS)


@dataclass(frozen=True)
class WaitPolicy:
    """How long and how hard to wait. Every default comes from the `WAITS_*` settings.

    Callback mode (the default): after the service accepts, backup checks run at `marks`
    (seconds after acceptance); still pending at the last mark fails the job with
    `deadline_exceeded`. Polling mode (`callback=False`, for services without callbacks): checks
    run `min_interval` after acceptance, then back off by `factor` up to `max_interval`, until
    `max_duration` has passed (then `deadline_exceeded`).

    Budgets: `max_throttle_bounces` answers of 429 (each honouring `Retry-After`) before
    `throttled`; `max_transport_failures` consecutive timeouts, resets or unusable bodies (retried
    after `transport_backoff` * 2**(n-1) seconds) before `gateway_unavailable` (the count starts
    again whenever a call reaches the service); `max_executions` runs of the handler through this
    wait before `wait_backstop` (a runaway loop).
    """

    marks: tuple[float, ...] = field(default_factory=_default_marks)
    callback: bool = True
    min_interval: float = field(default_factory=lambda: settings.WAITS_POLL_MIN_INTERVAL)
    max_interval: float = field(default_factory=lambda: settings.WAITS_POLL_MAX_INTERVAL)
    factor: float = 2.0
    max_duration: float = field(default_factory=lambda: settings.WAITS_POLL_MAX_DURATION)
    max_throttle_bounces: int = field(default_factory=lambda: settings.WAITS_MAX_THROTTLE_BOUNCES)
    max_transport_failures: int = field(default_factory=lambda: settings.WAITS_MAX_TRANSPORT_FAILURES)
    transport_backoff: float = field(default_factory=lambda: settings.WAITS_TRANSPORT_BACKOFF)
    max_executions: int = field(default_factory=lambda: settings.WAITS_MAX_EXECUTIONS)

    def __post_init__(self) -> None:
        marks = tuple(float(mark) for mark in self.marks)
        if self.callback and (not marks or any(mark <= 0 for mark in marks) or list(marks) != sorted(marks)):
            raise ValueError(f"marks must be positive and ascending, not {self.marks!r}")
        if self.min_interval <= 0 or self.max_interval < self.min_interval or self.factor < 1:
            raise ValueError("polling needs 0 < min_interval <= max_interval and factor >= 1")
        object.__setattr__(self, "marks", marks)

    def as_dict(self) -> dict[str, Any]:
        """The policy as JSON, stored on the wait so that admins see what applies."""
        return {**asdict(self), "marks": list(self.marks)}

    @property
    def deadline(self) -> float:
        """Seconds after acceptance at which a still-pending wait fails."""
        return self.marks[-1] if self.callback else self.max_duration


@dataclass(frozen=True)
class Person:
    """A person who may stand in for the service in a combined wait:
    `ctx.wait_for(..., person=Person(prompt, schema=...), timeout=..., on_timeout=...)`.

    While the job is parked on the wait, one of the `assignees` (usernames and `"group:name"`s;
    default APPROVALS_DEFAULT_ASSIGNEES, the group `reviewers`; the same rule as questions: the
    `approvals.answer_question` permission, no self-approval unless the kind allows it) may,
    in the admin, on the job's page or through the API: provide the result (validated against
    `schema`, a JSON Schema), retry the submit (a new token, the marks start again), or fail
    the wait with a reason. `prompt` and `details` say what they are standing in for.
    """

    prompt: str
    schema: dict[str, Any]
    details: Any = None
    assignees: str | list[str] | None = None
