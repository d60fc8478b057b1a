"""Job kinds: a name, a handler, a JSON Schema for the input.

    from jobs.registry import job_kind

    @job_kind("billing.invoice", input_schema={...}, description="...")
    def invoice(ctx, input):
        ...

Kinds live in a `kinds` module of any installed app; `JobsConfig.ready` imports them all, so
every process (web, worker, beat) knows the same kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from jobs.errors import InvalidInput, UnknownKind

Handler = Callable[..., Any]

ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class JobKind:
    name: str
    handler: Handler
    input_schema: dict = field(default_factory=lambda: dict(ANY_OBJECT))
    description: str = ""
    # None: settings.JOBS_DEFAULT_MAX_ATTEMPTS.
    max_attempts: int | None = None
    # May the job's own submitter answer its questions? (reviewers' rules)
    allow_self_approval: bool = False
    # A Celery queue of its own (None: the default queue).
    queue: str | None = None
    # A URL told (signed, retried: see `webhooks`) whenever a question of this kind opens.
    notify_webhook: str | None = None
    # Seconds one run may take (a soft limit; None: JOBS_TIME_LIMIT), and what a run past it
    # does: "fail" (the job fails with the code `timeout`) or "retry" (while attempts remain).
    time_limit: float | None = None
    on_time_limit: str = "fail"

    def validate_input(self, value: Any) -> None:
        """Raise InvalidInput naming the first offending field when `value` breaks the schema."""
        validator = Draft202012Validator(self.input_schema)
        error = best_match(validator.iter_errors(value))
        if error is None:
            return
        where = ".".join(str(part) for part in error.absolute_path)
        field_name = f"input.{where}" if where else "input"
        raise InvalidInput(f"{field_name}: {error.message}", field=field_name)


_kinds: dict[str, JobKind] = {}


def job_kind(
    name: str,
    *,
    input_schema: dict | None = None,
    description: str | None = None,
    max_attempts: int | None = None,
    allow_self_approval: bool = False,
    queue: str | None = None,
    notify_webhook: str | None = None,
    time_limit: float | None = None,
    on_time_limit: str = "fail",
) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of job kind `name`.

    The handler is called as `handler(ctx, input)` with a `jobs.runtime.JobContext` and the
    validated input; what it returns (JSON) becomes the job's result. `allow_self_approval` lets
    the job's submitter answer its questions; `notify_webhook` is a URL POSTed to (signed with
    APPROVALS_WEBHOOK_SECRET) when one of its questions opens. `time_limit` (seconds) ends a
    run that takes longer: the job fails with `timeout`, or with `on_time_limit="retry"` runs
    again while attempts remain (finished steps are not repeated). (`on_timeout` is a question's
    deadline policy, `ctx.ask(..., on_timeout=...)`: another thing.)
    """
    if on_time_limit not in ("fail", "retry"):
        raise ValueError(f"job kind {name!r}: on_time_limit must be 'fail' or 'retry', not {on_time_limit!r}")
    if time_limit is not None and time_limit <= 0:
        raise ValueError(f"job kind {name!r}: time_limit must be a positive number of seconds")
    schema = input_schema if input_schema is not None else dict(ANY_OBJECT)
    Draft202012Validator.check_schema(schema)  # a broken schema is the author's bug: fail at import

    def register(handler: Handler) -> Handler:
        existing = _kinds.get(name)
        if existing is not None and existing.handler is not handler:
            raise ValueError(f"job kind {name!r} is registered twice")
        _kinds[name] = JobKind(
            name=name,
            handler=handler,
            input_schema=schema,
            description=description if description is not None else (handler.__doc__ or "").strip(),
            max_attempts=max_attempts,
            allow_self_approval=allow_self_approval,
            queue=queue,
            notify_webhook=notify_webhook,
            time_limit=time_limit,
            on_time_limit=on_time_limit,
        )
        return handler

    return register


def kind_get(name: str) -> JobKind:
    """Return the kind registered as `name`, or raise UnknownKind listing the known ones."""
    try:
        return _kinds[name]
    except KeyError:
        known = ", ".join(sorted(_kinds)) or "none"
        raise UnknownKind(f"unknown job kind {name!r}; known kinds: {known}", field="kind") from None


def kinds_all() -> list[JobKind]:
    return [_kinds[name] for name in sorted(_kinds)]
