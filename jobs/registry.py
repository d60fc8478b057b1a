"""Job kinds: a name, a handler, a JSON Schema for the input.

    from jobs.registry import job_kind

    @job_kind("billing.invoice", description="...")
    def invoice(ctx: JobContext, input: InvoiceInput) -> InvoiceResult:   # pydantic models
        ...

    @job_kind("billing.legacy", input_schema={...})                      # or a JSON Schema
    def legacy(ctx, input):
        ...

Kinds live in a `kinds` module of any installed app; `JobsConfig.ready` imports them all, so
every process (web, worker, beat) knows the same kinds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from jobs import typed
from jobs.errors import InvalidInput, UnknownKind
from jobs.runtime import JobFailure

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
    # Typed kinds (`jobs.typed`): the pydantic models of the input and of the result. The input
    # schema is derived from `input_model`; `result_schema` from `result_model`.
    input_model: type | None = None
    result_model: type | None = None
    result_schema: dict | None = None

    def validate_input(self, value: Any) -> None:
        """Raise InvalidInput naming the first offending field when `value` breaks the schema
        (and, for a typed kind, the model's own validators)."""
        validator = Draft202012Validator(self.input_schema)
        error = best_match(validator.iter_errors(value))
        if error is not None:
            where = ".".join(str(part) for part in error.absolute_path)
            field_name = f"input.{where}" if where else "input"
            raise InvalidInput(f"{field_name}: {error.message}", field=field_name)
        if self.input_model is not None:
            try:
                typed.from_json(self.input_model, value)
            except typed.ValidationError as exc:
                field_name, message = typed.error_field(exc, "input")
                raise InvalidInput(f"{field_name}: {message}", field=field_name) from None

    def call(self, ctx: Any, input: Any) -> Any:
        """Run the handler once: the stored input as the handler's model (a typed kind), the
        returned value as the job's JSON result, checked against the result model if any.

        The one place where typed values are made from and turned into JSON for a run: the
        runner and `jobs.testing` call this, never the handler directly.
        """
        if self.input_model is not None:
            try:
                input = typed.from_json(self.input_model, input)
            except typed.ValidationError as exc:
                field_name, message = typed.error_field(exc, "input")
                raise JobFailure("invalid_input", f"{field_name}: {message}") from None
        return self.result_json(self.handler(ctx, input))

    def result_json(self, value: Any) -> Any:
        """What the handler returned, as the job's JSON result (validated by the result model)."""
        if self.result_model is not None:
            try:
                value = value if isinstance(value, self.result_model) else typed.from_json(self.result_model, value)
            except typed.ValidationError as exc:
                field_name, message = typed.error_field(exc, "result")
                raise JobFailure(
                    "invalid_result",
                    f"job kind {self.name!r} returned a result that breaks {self.result_model.__name__}: "
                    f"{field_name}: {message}",
                ) from None
        return typed.to_json(value)

    def result_value(self, result: Any) -> Any:
        """A stored JSON result as the kind's result model (as is for an untyped kind)."""
        if self.result_model is None or result is None:
            return result
        return typed.from_json(self.result_model, result)


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
    input_model: type | None = None,
    result_model: type | None = None,
) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of job kind `name`.

    The handler is called as `handler(ctx, input)` with a `jobs.runtime.JobContext` and the
    validated input; what it returns (JSON) becomes the job's result.

    **Typed kinds.** When the handler's `input` parameter is annotated with a pydantic model (or
    `input_model=` names one), the input schema is derived from the model, and the handler gets
    an instance of it. A return annotation that is a model (or `result_model=`) makes the
    returned value (a model instance, or data the model accepts) validated and stored as JSON.
    `input_schema` and an input model are exclusive. `allow_self_approval` lets
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

    def register(handler: Handler) -> Handler:
        existing = _kinds.get(name)
        if existing is not None and existing.handler is not handler:
            raise ValueError(f"job kind {name!r} is registered twice")
        hinted_input, hinted_result = _handler_models(handler)
        model = input_model or hinted_input
        output = result_model or hinted_result
        for what, candidate in (("input_model", model), ("result_model", output)):
            if candidate is not None and not typed.is_model(candidate):
                raise ValueError(f"job kind {name!r}: {what} must be a pydantic model class, not {candidate!r}")
        if model is not None and input_schema is not None:
            raise ValueError(f"job kind {name!r}: give an input model or an input_schema, not both")
        schema = _kind_schema(model) if model is not None else input_schema
        schema = schema if schema is not None else dict(ANY_OBJECT)
        Draft202012Validator.check_schema(schema)  # a broken schema is the author's bug: fail at import
        _kinds[name] = JobKind(
            name=name,
            handler=handler,
            input_schema=schema,
            input_model=model,
            result_model=output,
            result_schema=_kind_schema(output) if output is not None else None,
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


def _kind_schema(model: type) -> dict:
    """A kind's input or result schema, derived from its model. The model's class name (the
    schema's `title`) is the author's code, not the API's: it is left out, the docstring stays."""
    schema = typed.schema_of(model)
    schema.pop("title", None)
    return schema


def _handler_models(handler: Handler) -> tuple[type | None, type | None]:
    """The pydantic models a handler's annotations name for its input (its second parameter)
    and its result; None where an annotation is absent, not a model, or cannot be resolved
    (a name imported only under TYPE_CHECKING: pass `input_model=` then)."""
    try:
        parameters = list(inspect.signature(handler).parameters)
    except (TypeError, ValueError):
        return None, None
    annotations = getattr(handler, "__annotations__", {}) or {}

    def resolve(key: str | None) -> type | None:
        hint = annotations.get(key) if key else None
        if isinstance(hint, str):
            try:
                hint = eval(hint, getattr(handler, "__globals__", {}))  # noqa: S307 (the author's own annotation)
            except Exception:
                return None
        return hint if typed.is_model(hint) else None

    return resolve(parameters[1] if len(parameters) > 1 else None), resolve("return")


def kind_get(name: str) -> JobKind:
    """Return the kind registered as `name`, or raise UnknownKind listing the known ones."""
    try:
        return _kinds[name]
    except KeyError:
        known = ", ".join(sorted(_kinds)) or "none"
        raise UnknownKind(f"unknown job kind {name!r}; known kinds: {known}", field="kind") from None


def kinds_all() -> list[JobKind]:
    return [_kinds[name] for name in sorted(_kinds)]
