"""Job kinds for the tests. Registered in every process started with the test settings."""

from demo.services import step_run_count, step_runs
from jobs.registry import job_kind
from jobs.runtime import JobFailure


@job_kind(
    "test.flaky",
    input_schema={
        "type": "object",
        "properties": {"fail_times": {"type": "integer", "minimum": 0}},
        "required": ["fail_times"],
    },
    max_attempts=3,
)
def flaky(ctx, input):
    """Finishes step `a`, then raises on its first `fail_times` runs."""
    ctx.step("a", lambda: step_run_count(job_id=ctx.job_id, step="a") or "done")
    step_run_count(job_id=ctx.job_id, step="body")
    if ctx.attempt <= input["fail_times"]:
        raise RuntimeError(f"planned failure on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt, "step_runs": step_runs(job_id=ctx.job_id)}


@job_kind("test.refuse", input_schema={"type": "object"})
def refuse(ctx, input):
    """Fails at once with its own error code (no retry)."""
    raise JobFailure("bad_data", "the input data cannot be processed")


@job_kind("test.ask_changing", input_schema={"type": "object", "properties": {"prompt": {"type": "string"}}})
def ask_changing(ctx, input):
    """Asks with a prompt taken from the input, to test changed questions."""
    return ctx.ask("q", input.get("prompt", "first"))


@job_kind(
    "test.progress_burst",
    input_schema={"type": "object", "properties": {"reports": {"type": "integer", "minimum": 1}}},
)
def progress_burst(ctx, input):
    """Reports progress in a tight loop, then returns: the coalescing must keep the last report."""
    reports = input.get("reports", 1000)
    for number in range(1, reports + 1):
        ctx.progress(number / reports, f"report {number}")
    return {"reports": reports}


def _policy(spec):
    """An on_timeout policy from its JSON description (as the tests pass it in a job's input)."""
    from approvals.policies import Cancel, Default, Escalate, Fail

    if spec is None:
        return None
    action = spec["action"]
    if action == "default":
        return Default(spec["answer"])
    if action == "cancel":
        return Cancel()
    if action == "escalate":
        return Escalate(to=spec["to"], timeout=spec.get("timeout"), on_timeout=_policy(spec.get("then")))
    return Fail()


@job_kind("test.ask", input_schema={"type": "object"})
def ask(ctx, input):
    """Asks one question built from its input (schema, assignees, quorum, deadline); returns the
    answer, who gave it and who approved."""
    key = input.get("key", "q")
    answer = ctx.ask(
        key,
        input.get("prompt", "A question?"),
        schema=input.get("schema"),
        details=input.get("details"),
        assignees=input.get("assignees"),
        required_approvals=input.get("required_approvals", 1),
        timeout=input.get("timeout"),
        on_timeout=_policy(input.get("on_timeout")),
        valid_for=input.get("valid_for"),
    )
    question = ctx.question(key)
    by = question.answered_by.get_username() if question.answered_by else "system"
    return {"answer": answer, "by": by, "approvers": question.approvers(), "round": question.round}


@job_kind("test.ask_then_confirm", input_schema={"type": "object"})
def ask_then_confirm(ctx, input):
    """Asks `q` as test.ask does, then `confirm` of the default reviewers: between the two a test
    can change what `q`'s answer is judged by (a reviewer, the policy in the input, time)."""
    first = ctx.ask(
        "q",
        "A question?",
        assignees=input.get("assignees"),
        required_approvals=input.get("required_approvals", 1),
        timeout=input.get("timeout"),
        valid_for=input.get("valid_for"),
    )
    confirmed = ctx.ask("confirm", "Confirm?")
    question = ctx.question("q")
    return {"answer": first, "confirmed": confirmed, "approvers": question.approvers(), "round": question.round}


@job_kind("test.crash", input_schema={"type": "object"}, max_attempts=2)
def crash(ctx, input):
    """A poison job: finishes step `a`, then kills its own worker process every time (as a
    segfault or an out-of-memory kill would)."""
    import os
    import signal

    ctx.step("a", lambda: step_run_count(job_id=ctx.job_id, step="a") or "done")
    step_run_count(job_id=ctx.job_id, step="body")
    os.kill(os.getpid(), signal.SIGKILL)


def _busy(seconds: float) -> None:
    """Work that reaches no ctx call for `seconds` (so it sees no cancellation)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


OVERRUN_INPUT = {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}


@job_kind("test.overrun", input_schema=OVERRUN_INPUT, time_limit=1)
def overrun(ctx, input):
    """Finishes step `a`, then works past its 1 s time limit: the job fails with `timeout`."""
    ctx.step("a", lambda: step_run_count(job_id=ctx.job_id, step="a") or "done")
    step_run_count(job_id=ctx.job_id, step="body")
    _busy(input["seconds"])
    return {"finished": True}


@job_kind("test.overrun_retry", input_schema=OVERRUN_INPUT, time_limit=1, on_time_limit="retry", max_attempts=2)
def overrun_retry(ctx, input):
    """As test.overrun, but a run past the limit is retried (while attempts remain)."""
    return overrun(ctx, input)


@job_kind("test.stubborn", input_schema=OVERRUN_INPUT)
def stubborn(ctx, input):
    """Finishes step `a`, then works `seconds` without a ctx call: a cancellation meanwhile is
    only seen by terminating the run."""
    ctx.step("a", lambda: step_run_count(job_id=ctx.job_id, step="a") or "done")
    step_run_count(job_id=ctx.job_id, step="body")
    _busy(input["seconds"])
    ctx.step("b", lambda: step_run_count(job_id=ctx.job_id, step="b") or "done")
    return {"finished": True}


@job_kind("test.lines", input_schema={
    "type": "object",
    "properties": {"documents": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                   "urgent": {"type": "boolean"}},
    "required": ["documents"],
    "additionalProperties": False,
})
def lines(ctx, input):
    """Takes a list of texts (the submit form asks for one per line)."""
    return {"count": len(input["documents"])}


# -- typed kinds, child jobs and the replay check (tests/jobs/test_typed.py, test_children.py, test_testing.py) --
import itertools  # noqa: E402

from pydantic import BaseModel, ConfigDict, Field, field_validator  # noqa: E402

from jobs.runtime import JobContext  # noqa: E402


class Invoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    customer: str = Field(min_length=1)
    amount: float = Field(gt=0)
    lines: list[str] = Field(default_factory=list)

    @field_validator("customer")
    @classmethod
    def _not_test(cls, value: str) -> str:
        if value == "nobody":  # a rule no JSON Schema says: only the model's validator refuses it
            raise ValueError("nobody is not a customer")
        return value


class Billed(BaseModel):
    customer: str
    total: float
    note: str | None = None


@job_kind("test.typed")
def typed_kind(ctx: JobContext, input: Invoice) -> Billed:
    """A typed kind: the handler gets an Invoice and returns a Billed."""
    assert isinstance(input, Invoice)
    if input.lines == ["bad result"]:
        return {"customer": input.customer}  # breaks Billed: `total` is missing
    return Billed(customer=input.customer, total=input.amount)


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    score: int = Field(ge=1, le=5, title="Score")
    comment: str | None = Field(default=None, max_length=200)


@job_kind("test.typed_ask", input_model=Invoice)
def typed_ask(ctx, input):
    """Asks for a typed answer (a form derived from Verdict)."""
    verdict = ctx.ask("verdict", f"Rate the invoice of {input.customer}", answer=Verdict)
    assert isinstance(verdict, Verdict)
    return {"score": verdict.score, "comment": verdict.comment}


FANOUT_INPUT = {
    "type": "object",
    "properties": {
        "noop": {"type": "integer", "minimum": 0},
        "ask": {"type": "integer", "minimum": 0},
        "fail": {"type": "integer", "minimum": 0},
        "policy": {"enum": ["fail_fast", "collect"]},
        "nap": {"type": "number", "minimum": 0},
    },
}


@job_kind("test.fanout", input_schema=FANOUT_INPUT)
def fanout(ctx, input):
    """Spawns `noop` demo.noop children (demo.sleep of `nap` seconds in one step, with `nap`),
    `ask` test.ask children and `fail` test.refuse children, and gathers them all under
    `policy`; returns how they ended."""
    if input.get("nap"):
        noops = ctx.map("demo.sleep", [{"seconds": input["nap"], "steps": 1}] * input.get("noop", 0), key="noop")
    else:
        noops = ctx.map("demo.noop", [{}] * input.get("noop", 0), key="noop")
    asks = ctx.map("test.ask", [{"prompt": f"child {n}?"} for n in range(input.get("ask", 0))], key="ask")
    fails = ctx.map("test.refuse", [{}] * input.get("fail", 0), key="fail")
    policy = input.get("policy", "fail_fast")
    outcomes = ctx.gather(noops, asks, fails, policy=policy)
    if policy == "fail_fast":
        return {"results": len(outcomes)}
    return {"statuses": [outcome.status for outcome in outcomes], "ok": sum(outcome.ok for outcome in outcomes)}


@job_kind("test.spawn_changing", input_schema={"type": "object"})
def spawn_changing(ctx, input):
    """Spawns a child whose input comes from the job's input: a changed input on replay."""
    child = ctx.spawn("demo.sleep", {"seconds": 0, "steps": input.get("steps", 1)}, key="sleeper")
    ctx.ask("go", "Go on?")
    return ctx.gather(child)


_order_runs = itertools.count()


@job_kind("test.nondeterministic_order", input_schema={"type": "object"})
def nondeterministic_order(ctx, input):
    """Breaks the replay rule: the order of its steps flips from one run to the next."""
    names = ["a", "b"] if next(_order_runs) % 2 == 0 else ["b", "a"]
    return [ctx.step(name, lambda name=name: name) for name in names]


_prompt_runs = itertools.count()


@job_kind("test.nondeterministic_prompt", input_schema={"type": "object"})
def nondeterministic_prompt(ctx, input):
    """Breaks the replay rule: its question's prompt changes on every run (as one with the time in it)."""
    ctx.step("prepare", lambda: "ready")
    return ctx.ask("approve", f"Approve? (asked in run {next(_prompt_runs)})")


@job_kind("test.deterministic", input_schema={"type": "object"})
def deterministic(ctx, input):
    """Keeps the replay rule: what varies is inside a step."""
    import random

    draw = ctx.step("draw", lambda: random.randint(1, 6))
    answer = ctx.ask("approve", f"Approve the draw {draw}?")
    total = ctx.step("total", lambda: draw * 2)
    return {"draw": draw, "total": total, "approved": answer["approved"]}


def _awkward(name: str):
    """A value that is not JSON, or that PostgreSQL refuses to store as JSON."""
    import datetime
    import decimal

    return {
        "datetime": lambda: {"at": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)},
        "decimal": lambda: {"amount": decimal.Decimal("1.10")},
        "set": lambda: {"tags": {"a", "b"}},
        "nan": lambda: {"score": float("nan")},
        "infinity": lambda: [float("inf")],
        "nul": lambda: {"text": "a\x00b"},
        "nul_key": lambda: {"a\x00b": 1},
        "surrogate": lambda: "\ud800",
        "fine": lambda: {"ok": [1, 2.5, "x", None, True]},
    }[name]()


AWKWARD_INPUT = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}


@job_kind("test.returns", input_schema=AWKWARD_INPUT)
def returns(ctx, input):
    """Returns the awkward value named by `value` as the job's result."""
    return _awkward(input["value"])


@job_kind("test.step_returns", input_schema=AWKWARD_INPUT)
def step_returns(ctx, input):
    """A step returns the awkward value named by `value`."""
    def body():
        step_run_count(job_id=ctx.job_id, step="awkward")
        return _awkward(input["value"])

    ctx.step("awkward", body)
    return {"done": True}


@job_kind("test.step_type_error", input_schema={"type": "object"})
def step_type_error(ctx, input):
    """A step whose own code raises TypeError on its first run (a bug, or a flaky library)."""
    def body():
        step_run_count(job_id=ctx.job_id, step="typed")
        if step_runs(job_id=ctx.job_id)["typed"] == 1:
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")
        return "fine the second time"

    return {"value": ctx.step("typed", body)}


@job_kind("test.database_error", input_schema={"type": "object", "properties": {"real": {"type": "boolean"}}})
def database_error(ctx, input):
    """Finishes step `a`, then meets a database error that names the connection: with `real`, its
    own connection really dies (the server terminates it); else an error that only says so, while
    the connection and the database are fine (a statement's own failure)."""
    from django.db import OperationalError, connection

    ctx.step("a", lambda: step_run_count(job_id=ctx.job_id, step="a") or "done")
    step_run_count(job_id=ctx.job_id, step="body")
    if input.get("real"):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    raise OperationalError("could not receive data from server: the connection was reset")


@job_kind("test.model", input_schema={"type": "object"}, max_attempts=3)
def model(ctx, input):
    """The stateful model's kind (tests/model): the model drives most runs move by move; a
    message delivered to a worker (`job_execute`) runs this: one step, then done."""
    ctx.step("s1", lambda: "handler")
    return {"done": True}


def _database_time() -> str:
    """The database server's time now (the clock every host shares), as ISO text."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0].isoformat()


CLOCK_INPUT = {
    "type": "object",
    "properties": {name: {"type": "number", "minimum": 0} for name in ("busy", "timeout", "poll")},
    "required": ["busy", "timeout", "poll"],
}


@job_kind("test.clock", input_schema=CLOCK_INPUT, max_attempts=3)
def clock(ctx, input):
    """Steps, asks and waits, for a worker whose clock is wrong (tests/chaos/test_clocks.py).

    Step `a` works for `busy` seconds (its lease must be renewed meanwhile); question `q` has a
    deadline of `timeout` seconds that nobody meets (its default answers it); wait `w` polls a
    pretend service every `poll` seconds, done at its first look; then step `b`. Before the
    question and before the wait, a step keeps the database's time, so that the test can tell
    when each was due whatever the worker's own clock says."""
    from datetime import UTC, datetime

    from approvals.policies import Default
    from waits.policy import CheckResult, WaitPolicy

    ctx.step("clocks", lambda: {"worker": datetime.now(UTC).isoformat(), "database": _database_time()})
    ctx.step("a", lambda: (_busy(input["busy"]), step_run_count(job_id=ctx.job_id, step="a"))[1] or "done")
    ctx.step("before_ask", _database_time)
    answer = ctx.ask("q", "Go on?", timeout=input["timeout"], on_timeout=Default({"approved": True}))
    ctx.step("before_wait", _database_time)
    policy = WaitPolicy(callback=False, min_interval=input["poll"], max_interval=input["poll"], max_duration=600)
    result = ctx.wait_for("w", submit=lambda token, url: "pretend", check=lambda external_id: CheckResult.succeeded(
        {"done": True}), policy=policy, service="pretend")
    ctx.step("b", lambda: step_run_count(job_id=ctx.job_id, step="b") or "done")
    return {"answer": answer, "waited": result, "step_runs": step_runs(job_id=ctx.job_id)}


@job_kind("test.process_state", input_schema={"type": "object"})
def process_state(ctx, input):
    """What the pool process running a job was set up with (taskplatform/celery.py, heap.py): the
    garbage collector, the switch interval, the task signals' receivers, and the PostgreSQL
    backend of the connection the job ran on (None elsewhere) and how many tasks it served before,
    and which of the modules its main process loads for the pool are loaded."""
    import gc
    import os
    import sys
    import weakref

    from celery import signals
    from django.db import connection

    from dbkit.tasks import task_connections
    from taskplatform.celery import POOL_PRELOADED

    def receivers(signal) -> list[str]:
        live = (r() if isinstance(r, weakref.ReferenceType) else r for _, r in signal.receivers)
        return sorted(f"{type(getattr(r, '__self__', None)).__name__}.{r.__name__}" if hasattr(r, "__self__")
                      else f"{r.__module__}.{r.__name__}" for r in live if r is not None)

    backend = connection.connection.info.backend_pid if connection.vendor == "postgresql" else None
    return {"frozen": gc.get_freeze_count(), "collecting": gc.isenabled(), "switch_interval": sys.getswitchinterval(),
            "task_prerun": receivers(signals.task_prerun), "task_postrun": receivers(signals.task_postrun),
            "backend_pid": backend, "pid": os.getpid(), "tasks_on_connection": task_connections.tasks,
            "preloaded": sorted(name for name in POOL_PRELOADED if name in sys.modules)}
