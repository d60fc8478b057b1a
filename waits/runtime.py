"""`ctx.wait_for`: hand work to an outside service, park the job, pick up the result when woken.

One call of `wait_for` does one step of the wait and then either returns the result or stops
the run (`ParkForWait`, or `JobFailure` with the wait's error code). The handler runs again from
the top when the job is woken (by the callback, a backup mark, a poll or a person), reaches the
same `wait_for` and takes the next step (a wait that a person or its deadline ended returns what
they gave at once; see `waits.people`):

    submitting --accepted--> waiting --check: pending--> waiting ... --check: succeeded--> result
        |  429 / transport fault: park until Retry-After / back-off, same token next time
        +-- budget spent: throttled / gateway_unavailable; past the last mark: deadline_exceeded
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from jobs import typed
from jobs.clock import database_now
from jobs.runtime import JobFailure, ParkForWait
from jobs.timestamps import iso_utc
from waits.models import Channel, Wait, WaitDecision
from waits.people import person_spec_build
from waits.policy import CheckResult, Person, Throttled, TransportError, WaitPolicy
from waits.services import (
    Event,
    wait_execution_begin,
    wait_fail_apply,
    wait_open,
    wait_park_apply,
    wait_update,
    wake_token,
    wake_url,
)

if TYPE_CHECKING:
    from jobs.models import Job
    from jobs.runtime import JobContext

Submit = Callable[[str, "str | None"], Any]
Check = Callable[[str], CheckResult]


def wait_for(ctx: JobContext, key: str, *, submit: Submit, check: Check, policy: WaitPolicy | None = None,
             service: str = "", person: Person | None = None, timeout: float | timedelta | None = None,
             on_timeout: Any = None, result: Any = None) -> Any:
    """`ctx.wait_for`: hand work to an outside service and return its result, without holding a
    worker.

    `submit(token, callback_url)` hands the work out and returns the service's id for it;
    `check(external_id)` returns a `waits.policy.CheckResult` (pending, succeeded(result),
    failed(reason)). Either may raise `waits.policy.Throttled(retry_after)` (a 429) or
    `TransportError` (a timeout, a reset, a body that does not parse). The `token` is minted
    once and is the same for every retry of the submit: pass it on as the idempotency key.
    `callback_url` (None in polling mode) is `PUBLIC_URL/api/wake/{token}/`: the service
    POSTs to it when done.

    After the service accepts, the job is `waiting` and the worker moves on. The callback,
    a backup check at one of the `policy`'s marks (default 60, 180 and 300 s after
    acceptance), or a person in the admin resumes the job; the handler runs again from the
    top and this call checks once: it returns the result, fails the job (`external_failed`,
    `deadline_exceeded` when still pending at the last mark, `throttled`,
    `gateway_unavailable`, `wait_backstop`) or parks again. `key` names the wait within the
    job and must be stable across runs. See `waits.policy.WaitPolicy` for the knobs.

    **The combined wait**: with `person=waits.policy.Person(prompt, schema=...)` a person may
    also end the wait while the job is parked on it (provide the result, validated against
    `schema`; retry the submit; fail the wait with a reason), in the admin, on the job's page
    or through the API. Then `timeout` (seconds or a timedelta from the first call; default
    none) is the one deadline of it all, with `on_timeout` as for questions
    (`approvals.policies`: `Default(result)`, `Fail()` (the default: `deadline_exceeded`),
    `Cancel()`, `Escalate(to=..., timeout=...)`), and the marks stay backup checks: pending
    at the last one, the wait goes on until the callback, a person or the deadline. Whichever
    comes first ends it, exactly once, with a row in the wait's ledger naming its channel
    (`callback`, `check`, `person`, `deadline`). See `waits.people`.

    `result` (a pydantic model or another type) types the outcome: `check` may return
    `CheckResult.succeeded(instance)`, it is stored as JSON, and this call returns an instance.
    """
    ctx.flush()  # a held progress report goes first
    policy = policy or WaitPolicy()
    spec = person_spec_build(key=key, person=person, timeout=timeout, on_timeout=on_timeout)
    done = Wait.objects.filter(job_id=ctx.job_id, key=key, state=Wait.State.SUCCEEDED).first()
    if done is not None:  # a finished wait's result is read, not written: nothing to fence
        return _result_as(result, key, done.result)
    # Every write before `submit` is fenced to this run (a cancelled or stale run raises RunLost
    # here, before anything leaves the platform).
    wait = wait_open(job_id=ctx.job_id, key=key, service=service, policy=policy, person=spec,
                     run_attempt=ctx.attempt)
    if wait.state == Wait.State.SUCCEEDED:
        return _result_as(result, key, wait.result)
    wait = wait_execution_begin(wait=wait, run_attempt=ctx.attempt)
    if wait.executions > policy.max_executions:
        _fail(ctx, wait, "wait_backstop",
              f"the job ran {wait.executions} times through wait {key!r}, more than max_executions "
              f"({policy.max_executions}); stopped as a runaway loop")
    if wait.state == Wait.State.SUBMITTING:
        _submit(ctx, wait, policy, submit)
    return _result_as(result, key, _check(ctx, wait, policy, check))


def _result_as(result_type: Any, key: str, value: Any) -> Any:
    if result_type is None:
        return value
    try:
        return typed.from_json(result_type, value)
    except typed.ValidationError as exc:
        field, message = typed.error_field(exc, "result")
        raise JobFailure("invalid_result", f"the result of wait {key!r} does not fit "
                         f"{getattr(result_type, '__name__', result_type)}: {field}: {message}") from None


def _submit(ctx: JobContext, wait: Wait, policy: WaitPolicy, submit: Submit) -> NoReturn:
    token = wake_token(wait.token_salt)
    try:
        external_id = submit(token, wake_url(token) if policy.callback else None)
    except Throttled as exc:
        _throttled(ctx, wait, policy, exc)
    except TransportError as exc:
        _transport_failed(ctx, wait, policy, exc)
    now = database_now()  # the marks and the deadline: beat's due pass compares them with this clock
    first = policy.marks[0] if policy.callback else policy.min_interval
    fields = {
        "state": Wait.State.WAITING, "external_id": str(external_id), "accepted_at": now, "transport_failures": 0,
        "next_due_at": now + timedelta(seconds=first),
    }
    if not wait.has_person:  # a combined wait keeps its one deadline, from its first call
        fields["deadline_at"] = now + timedelta(seconds=policy.deadline)
    _park(ctx, wait, fields, "accepted", {"external_id": str(external_id)})


def _check(ctx: JobContext, wait: Wait, policy: WaitPolicy, check: Check) -> Any:
    try:
        outcome = check(wait.external_id)
    except Throttled as exc:
        _throttled(ctx, wait, policy, exc)
    except TransportError as exc:
        _transport_failed(ctx, wait, policy, exc)
    if not isinstance(outcome, CheckResult):
        raise TypeError(f"check() must return a waits.policy.CheckResult, not {type(outcome).__name__}")
    now = database_now()  # after the call: the deadline and the next mark are judged by this clock
    checks = wait.checks + 1
    fields: dict[str, Any] = {"checks": checks, "transport_failures": 0, "last_checked_at": now}
    checked: Event = ("checked", {"outcome": outcome.state, "checks": checks})
    # What ended it, if this look does: the callback that woke this run, or a check of our own.
    channel = Channel.CALLBACK if wait.woken_by == "callback" else Channel.CHECK
    if outcome.state == "succeeded":
        value = typed.to_json(outcome.result)  # a model from check() is stored as JSON
        fields.update(state=Wait.State.SUCCEEDED, result=value, next_due_at=None, ended_by=channel, ended_at=now)
        done: Event = ("done", {"checks": checks, "executions": wait.executions, "by": channel})
        wait_update(wait=wait, fields=fields, events=[checked, done], run_attempt=ctx.attempt,
                    decision={"kind": WaitDecision.Kind.SUCCEEDED, "channel": channel, "result": value,
                              "detail": {"checks": checks, "external_id": wait.external_id}})
        return value
    if outcome.state == "failed":
        _fail(ctx, wait, "external_failed", f"{wait.service or 'the service'} failed: {outcome.reason}",
              fields, [checked], channel=channel)
    if outcome.progress is not None:
        ctx.progress(outcome.progress, outcome.text)
    if not wait.has_person and wait.deadline_at is not None and now >= wait.deadline_at:
        _fail(ctx, wait, "deadline_exceeded",
              f"{wait.service or 'the external work'} was still pending {policy.deadline:g}s after it was accepted",
              fields, [checked], channel=Channel.DEADLINE)
    fields["next_due_at"] = _next_look(wait, policy, now, checks)
    _park(ctx, wait, fields, "pending", {}, events=[checked])


def _next_look(wait: Wait, policy: WaitPolicy, now: datetime, checks: int) -> datetime | None:
    """The next backup mark after now (callback mode), or the next poll (polling mode). None for
    a combined wait past its last mark (or its polling time): from then on the callback, a
    person or its deadline ends it."""
    accepted = wait.accepted_at or now
    deadline = accepted + timedelta(seconds=policy.deadline) if wait.has_person else (wait.deadline_at or now)
    if policy.callback:
        for mark in policy.marks:
            due = accepted + timedelta(seconds=mark)
            if due > now:
                return due
        return None if wait.has_person else deadline
    if wait.has_person and now >= deadline:
        return None
    interval = min(policy.max_interval, policy.min_interval * policy.factor ** checks)
    return min(now + timedelta(seconds=interval), deadline)


def _throttled(ctx: JobContext, wait: Wait, policy: WaitPolicy, exc: Throttled) -> NoReturn:
    # A 429 reached the service: the transport budget starts again. The mark clock starts only at
    # acceptance, so bounces before it do not eat into the deadline.
    bounces = wait.throttle_bounces + 1
    fields: dict[str, Any] = {"throttle_bounces": bounces, "transport_failures": 0}
    if bounces > policy.max_throttle_bounces:
        _fail(ctx, wait, "throttled",
              f"{wait.service or 'the service'} answered 429 {bounces} times (max_throttle_bounces "
              f"{policy.max_throttle_bounces})", fields)
    fields["next_due_at"] = database_now() + timedelta(seconds=exc.retry_after)
    _park(ctx, wait, fields, "throttled", {"retry_after": exc.retry_after, "bounces": bounces})


def _transport_failed(ctx: JobContext, wait: Wait, policy: WaitPolicy, exc: TransportError) -> NoReturn:
    failures = wait.transport_failures + 1
    fields: dict[str, Any] = {"transport_failures": failures,
                              "transport_failures_total": wait.transport_failures_total + 1}
    if failures > policy.max_transport_failures:
        _fail(ctx, wait, "gateway_unavailable",
              f"{wait.service or 'the service'} could not be reached {failures} times in a row "
              f"(max_transport_failures {policy.max_transport_failures}): {exc}", fields)
    delay = policy.transport_backoff * 2 ** (failures - 1)
    fields["next_due_at"] = database_now() + timedelta(seconds=delay)
    _park(ctx, wait, fields, "transport_error", {"error": str(exc)[:500], "failures": failures, "retry_in": delay})


def _park(ctx: JobContext, wait: Wait, fields: dict[str, Any], reason: str, detail: dict[str, Any],
          events: list[Event] | None = None) -> NoReturn:
    next_due = fields.get("next_due_at")
    deadline = fields.get("deadline_at", wait.deadline_at)
    parked: Event = ("parked", {
        "reason": reason, "service": wait.service, "external_id": fields.get("external_id", wait.external_id),
        "next_check_at": iso_utc(next_due),
        "deadline_at": iso_utc(deadline), **detail,
    })
    record = partial(wait_park_apply, wait=wait, fields=fields, events=[*(events or []), parked],
                     run_attempt=ctx.attempt)

    def apply(job: Job) -> bool:  # in the transaction that parks the job (jobs.services.job_suspend)
        return record()

    raise ParkForWait(key=wait.key, apply=apply, message={"wait": wait.key, "reason": reason})


def _fail(ctx: JobContext, wait: Wait, code: str, message: str, fields: dict[str, Any] | None = None,
          events: list[Event] | None = None, channel: str = Channel.SYSTEM) -> NoReturn:
    record = partial(wait_fail_apply, wait=wait, code=code, message=message, fields=fields or {},
                     events=events or [], run_attempt=ctx.attempt, channel=channel)
    raise JobFailure(code, message, record=record)
