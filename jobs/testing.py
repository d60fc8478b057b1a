"""Test a job kind in-process: no Celery, no web server, against the test database.

    import pytest
    from jobs.testing import run_kind

    @pytest.mark.django_db
    def test_an_approved_review():
        run = run_kind("demo.review", {"document": "Q3"}, answers={"approve": {"approved": True}})
        assert run.status == "completed"
        assert run.result == {"approved": True, "reviewer": "harness"}

`run_kind` submits the job and plays what the platform does, with the same runner, services and
status moves, in this process:

- **runs**: every pending job of the run (the kind's job and the children it spawns) is
  claimed and its handler run once, again and again, as workers would (a retry runs at once);
- **questions**: a job paused on a question gets `answers[key]` (a value, an `Answer(value,
  by=...)`, a list of `Answer`s for a quorum's votes, or a function of the question returning
  one of those), answered through the same service as the admin and the API; with `EXPIRE`, or
  with no answer and a deadline, the clock moves past the deadline and beat's deadline pass runs;
- **waits**: `ctx.wait_for` talks to a double instead of the service: `wait_results[key]` (a
  value, `WaitFailed(reason)`, `Pending(checks, then=...)` or `NEVER`, or a function of the job
  returning one) is the service's answer; the service "calls back" when its answer is final,
  else the clock moves to the next backup mark and beat's due pass runs;
- **children**: spawned jobs run in the same loop; a gathering parent wakes when they end;
- **the clock** (`Clock`: the platform's clock, the database's (`jobs.clock`), and
  `timezone.now()` while the run goes on) moves past deadlines and marks without sleeping.

It returns a `KindRunResult`: the status, the result (`value`: as the kind's result model), the
error, the events, how many times each step's body ran (`step_runs`) and the handler ran
(`runs`), and the jobs it spawned.

**The replay check** (on by default) holds the kind to the replay rule. Every run of a job
records its `ctx` calls; each run after the first must repeat the calls of the one before (a
changed question, a different step order, a spawn with another input fail the test with a
`NonDeterminism` naming the first call that differs). Once the job has completed, its handler
runs again from every checkpoint (with no step finished, with the first, the first two, … all),
inside a transaction that is rolled back, and must make the same calls and return the same
result.

The features plug in through `jobs.extensions.harness_driver` (approvals answers questions,
waits fakes the service), so this module, like the rest of the core, imports none of them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from jobs import extensions, runner, typed
from jobs.clock import clock_shift, database_now
from jobs.events import RunLost
from jobs.models import Job
from jobs.registry import kind_get
from jobs.runtime import JobContext, JobFailure, Suspend
from jobs.services import job_claim, job_submit

__all__ = [
    "EXPIRE",
    "NEVER",
    "Answer",
    "Call",
    "Clock",
    "HarnessError",
    "KindRun",
    "KindRunResult",
    "NonDeterminism",
    "Pending",
    "WaitFailed",
    "run_kind",
]

_real_now = timezone.now
Status = Job.Status
HARNESS_USER = "harness"


class HarnessError(AssertionError):
    """The run cannot go on: a question with no answer and no deadline, a wait with no result,
    more runs than `max_runs`."""


class NonDeterminism(AssertionError):
    """The kind broke the replay rule: a run (or a replay) made other `ctx` calls than the run
    before it."""


class _Abort(BaseException):  # noqa: N818
    """A harness error raised inside a handler (by a test double): a BaseException so that the
    runner does not record it as the job's own error."""

    def __init__(self, error: HarnessError) -> None:
        super().__init__(str(error))
        self.error = error


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"jobs.testing.{self.name}"


EXPIRE = _Sentinel("EXPIRE")  # answers={key: EXPIRE}: nobody answers; the deadline passes
NEVER = _Sentinel("NEVER")  # wait_results={key: NEVER}: the service never finishes


@dataclass(frozen=True)
class Answer:
    """An answer to give, by whom (a superuser of that name, made if missing) and with a comment."""

    value: Any
    by: str | None = None
    comment: str = ""


@dataclass(frozen=True)
class WaitFailed:
    """The outside service reports that the work failed."""

    reason: str = "failed"


@dataclass(frozen=True)
class Pending:
    """The service answers "pending" to the first `checks` checks, then `then` (a result,
    `WaitFailed`, or `NEVER`). `progress` is the progress it reports meanwhile."""

    checks: int
    then: Any = None
    progress: float | None = None


class Clock:
    """The platform's clock during a run: the database's (`jobs.clock`), and `timezone.now()`
    for what people read, plus an offset that only grows.

    `advance(seconds=..., minutes=..., ...)` and `advance_to(when)` move it; the harness moves
    it past a question's deadline or a wait's next mark when the run needs it to.
    """

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return _real_now() + self.offset

    def advance(self, seconds: float = 0, **delta: float) -> datetime:
        self.offset += timedelta(seconds=seconds, **delta)
        return self.now()

    def advance_to(self, when: datetime) -> datetime:
        """Move past `when` (by a millisecond), unless the clock is already there. `when` is a
        time the platform wrote (a deadline, a due time): it is compared with the database's
        clock, as the platform compares it."""
        with clock_shift(lambda: self.offset):
            behind = when - database_now()
        if behind >= timedelta(0):
            self.offset += behind + timedelta(milliseconds=1)
        return self.now()

    @contextmanager
    def installed(self) -> Iterator[Clock]:
        with mock.patch("django.utils.timezone.now", self.now), clock_shift(lambda: self.offset):
            yield self


@dataclass(frozen=True)
class Call:
    """One `ctx` call of a run, as the replay check compares them: the method, the key it was
    given, and a digest of its other arguments (functions left out)."""

    method: str
    key: str
    digest: str
    shown: str = field(compare=False, default="")

    def __str__(self) -> str:
        return f"ctx.{self.method}({self.key!r}{', ' + self.shown if self.shown else ''})"


@dataclass
class KindRunResult:
    """What `run_kind` returns."""

    job: Job
    status: str
    result: Any
    value: Any  # the result as the kind's result model (the JSON result for an untyped kind)
    error: dict | None
    events: list[dict[str, Any]]
    step_runs: dict[str, int]  # how many times each step's body ran
    runs: int  # how many times the handler ran
    calls: list[Call]  # the ctx calls of the last run
    children: list[Job]  # the jobs it spawned (and theirs), oldest first
    clock: Clock

    def child(self, key: str) -> Job:
        """The child spawned under `key` (`review.3` for the fourth of `ctx.map(..., key="review")`)."""
        return next(child for child in self.children if child.spawn_key == key)


def run_kind(
    kind: str,
    input: Any = None,
    *,
    answers: dict[str, Any] | None = None,
    wait_results: dict[str, Any] | None = None,
    clock: Clock | None = None,
    owner: Any = None,
    replay_check: bool = True,
    max_runs: int = 2000,
) -> KindRunResult:
    """Submit a job of `kind` with `input` (a dict or the kind's input model) and play it to its
    end in this process (see the module's docstring). Needs the test database
    (`@pytest.mark.django_db`). Invalid input raises `InvalidInput`, as the API would answer 400.
    """
    return KindRun(kind, input, answers=answers, wait_results=wait_results, clock=clock, owner=owner,
                   replay_check=replay_check, max_runs=max_runs).run()


class KindRun:
    """One `run_kind`: the drivers (`jobs.extensions.harness_driver`) read `answers`,
    `wait_results`, `clock` and keep their own state in `state`."""

    def __init__(self, kind: str, input: Any = None, *, answers: dict[str, Any] | None = None,
                 wait_results: dict[str, Any] | None = None, clock: Clock | None = None, owner: Any = None,
                 replay_check: bool = True, max_runs: int = 2000) -> None:
        self.kind = kind
        self.input = typed.to_json({} if input is None else input, unset=False)
        self.answers = dict(answers or {})
        self.wait_results = dict(wait_results or {})
        self.clock = clock or Clock()
        self.owner = owner
        self.replay_check = replay_check
        self.max_runs = max_runs
        self.state: dict[str, Any] = {}  # the drivers' own
        self.traces: dict[Any, list[list[Call]]] = {}
        self.root: Job | None = None

    # -- what drivers use ---------------------------------------------------------------------
    def answer_for(self, key: str, question: Any) -> Any:
        """`answers[key]` (called with the question when it is a function), or EXPIRE if absent."""
        value = self.answers.get(key, EXPIRE)
        return value(question) if callable(value) and not isinstance(value, type) else value

    def wait_result_for(self, key: str, job: Job) -> Any:
        """`wait_results[key]` (called with the job when it is a function); stops the run with a
        HarnessError when absent."""
        if key not in self.wait_results:
            raise self.abort(
                f"{job.kind} {job.pk} waits on {key!r} but wait_results has no {key!r}: pass "
                f"wait_results={{{key!r}: <the service's result>}} (or WaitFailed(...), Pending(...), NEVER)"
            )
        value = self.wait_results[key]
        return value(job) if callable(value) and not isinstance(value, type) else value

    def user(self, name: str | None = None) -> Any:
        """A superuser named `name` (default `harness`), made if missing: who answers."""
        users = get_user_model()
        user = users.objects.filter(username=name or HARNESS_USER).first()
        if user is None:
            user = users.objects.create_user(username=name or HARNESS_USER, is_staff=True, is_superuser=True)
        return user

    @staticmethod
    def abort(message: str) -> _Abort:
        """For a test double inside a handler: `raise run.abort("...")` stops `run_kind` with a
        HarnessError (the runner would record an ordinary exception as the job's error)."""
        return _Abort(HarnessError(message))

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> KindRunResult:
        try:
            return self._run_all()
        except _Abort as abort:
            raise abort.error from None

    def _run_all(self) -> KindRunResult:
        with self.clock.installed(), mock.patch("jobs.services.transitions.job_dispatch", _no_dispatch):
            self.root, _ = job_submit(kind=self.kind, input=self.input, owner=self.owner)
            handler_runs = 0
            while True:
                pending = self._family().filter(status=Status.PENDING).order_by("created_at", "pk")
                ids = list(pending.values_list("pk", flat=True))
                if ids:
                    for job_id in ids:
                        handler_runs += 1
                        if handler_runs > self.max_runs:
                            raise HarnessError(f"more than {self.max_runs} runs: does the kind loop forever?")
                        self._run_once(job_id)
                    continue
                if not self._resume_one():
                    break
            root = Job.objects.get(pk=self.root.pk)
            if self.replay_check:
                for job in self._family().filter(status=Status.COMPLETED).order_by("created_at", "pk"):
                    self._replay_from_every_checkpoint(job)
        return self._result(root)

    def _family(self):
        ids = {self.root.pk}
        frontier = {self.root.pk}
        while frontier:
            frontier = set(Job.objects.filter(parent_id__in=frontier).values_list("pk", flat=True)) - ids
            ids |= frontier
        return Job.objects.filter(pk__in=ids)

    def _resume_one(self) -> bool:
        """Play the outside world for one suspended job. False when nothing is left to do."""
        suspended = list(self._family().filter(status__in=[Status.PAUSED, Status.WAITING]).order_by("created_at"))
        for job in suspended:
            for driver in extensions.harness_drivers():
                if driver.status == job.status and driver.resume(job, self):
                    return True
        if not suspended:
            return False
        root = Job.objects.get(pk=self.root.pk)
        if root.is_finished:
            return False  # children left waiting by a finished parent stay as they are
        stuck = ", ".join(f"{job.kind} {str(job.pk)[:8]} is {job.status}" for job in suspended)
        raise HarnessError(f"the run cannot go on: {stuck}, and no driver can resume it")

    def _run_once(self, job_id: Any) -> None:
        run_after = Job.objects.filter(pk=job_id).values_list("run_after", flat=True).first()
        if run_after is not None:  # a retry's back-off: the clock skips it, nobody sleeps
            self.clock.advance_to(run_after)
        job = job_claim(job_id=job_id, worker="jobs.testing")
        kind = kind_get(job.kind)
        ctx = JobContext(job, worker_hostname="jobs.testing")
        calls = self._prepare(ctx)
        runner._run(kind, ctx, job)  # a harness error inside (an _Abort) goes up to `run`
        runs = self.traces.setdefault(job.pk, [])
        runs.append(calls)
        if self.replay_check and len(runs) > 1:
            _compare(runs[-2], calls, job=job, what=f"run {len(runs)}", against=f"run {len(runs) - 1}")

    def _prepare(self, ctx: JobContext) -> list[Call]:
        ctx.harness = self  # type: ignore[attr-defined]
        for driver in extensions.harness_drivers():
            if driver.prepare is not None:
                driver.prepare(ctx, self)
        calls: list[Call] = []
        depth = [0]
        for name in ["step", *extensions.context_method_names()]:
            setattr(ctx, name, _recording(name, getattr(ctx, name), calls, depth))
        return calls

    # -- the replay check ---------------------------------------------------------------------
    def _replay_from_every_checkpoint(self, job: Job) -> None:
        runs = self.traces.get(job.pk)
        if not runs:
            return
        reference = runs[-1]
        finished = job.checkpoint  # read once: a view of the job's step rows
        steps = [call.key for call in reference if call.method == "step" and call.key in finished]
        for kept in range(len(steps) + 1):
            checkpoint = {name: finished[name] for name in steps[:kept]}
            calls, outcome = self._replay(job, checkpoint)
            where = f"the replay from checkpoint {kept}" + (f" (after step {steps[kept - 1]!r})" if kept else
                                                               " (no step finished)")
            _compare(reference, calls, job=job, what=where, against="the recorded run")
            if kept == len(steps) and outcome != ("returned", job.result):
                raise NonDeterminism(
                    f"{job.kind} {job.pk} is not deterministic: {where} ended with {outcome[0]} "
                    f"{_short(outcome[1])} where the recorded run returned {_short(job.result)}. "
                    f"{REPLAY_RULE}"
                )

    def _replay(self, job: Job, checkpoint: dict[str, Any]) -> tuple[list[Call], tuple[str, Any]]:
        job = Job.objects.get(pk=job.pk)
        kind = kind_get(job.kind)
        ctx = _ReplayContext(job, checkpoint)
        calls = self._prepare(ctx)
        outcome: tuple[str, Any] = ("stopped", None)
        try:
            with transaction.atomic():
                try:
                    outcome = ("returned", kind.call(ctx, job.input))
                except (_ReplayStop, RunLost):
                    outcome = ("stopped", None)  # it would do new work here: the replay ends
                except Suspend as exc:
                    outcome = ("suspended", exc.status)
                except JobFailure as exc:
                    outcome = ("failed", f"{exc.code}: {exc.message}")
                except Exception as exc:
                    outcome = ("raised", f"{type(exc).__name__}: {exc}")
                raise _Rollback
        except _Rollback:
            pass
        return calls, outcome

    # -- the result ---------------------------------------------------------------------------
    def _result(self, root: Job) -> KindRunResult:
        events = [event.as_dict() for event in root.events.order_by("seq")]
        step_runs = Counter(e["step"] for e in events if e["type"] == "step" and e["status"] == "started")
        try:
            value = kind_get(root.kind).result_value(root.result)
        except typed.ValidationError:
            value = root.result
        children = list(self._family().exclude(pk=root.pk).order_by("created_at", "pk"))
        runs = self.traces.get(root.pk, [])
        return KindRunResult(
            job=root, status=root.status, result=root.result, value=value, error=root.error, events=events,
            step_runs=dict(step_runs), runs=len(runs), calls=runs[-1] if runs else [], children=children,
            clock=self.clock,
        )


REPLAY_RULE = (
    "Code outside ctx.step runs again on every resume and must make the same ctx calls, in the same "
    "order, with the same arguments: move what varies (the time, random numbers, reads of data that "
    "change) into a ctx.step, whose result is stored."
)


class _ReplayStop(BaseException):  # noqa: N818
    pass


class _Rollback(Exception):  # noqa: N818
    pass


class _ReplayContext(JobContext):
    """A context for a replay: finished steps return their stored results, anything new stops
    the replay, and nothing is written."""

    def __init__(self, job: Job, checkpoint: dict[str, Any]) -> None:
        super().__init__(job, worker_hostname="jobs.testing replay")
        self._checkpoint = dict(checkpoint)

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        if name in self._checkpoint:
            return self._checkpoint[name]
        raise _ReplayStop(name)

    def progress(self, fraction: float, text: str = "") -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction must be between 0 and 1, not {fraction}")

    def log(self, text: str, level: str = "info") -> None:
        pass

    def flush(self) -> None:
        pass

    def _hand_back_if_asked(self) -> None:
        pass

    def _event(self, *args: Any, **kwargs: Any) -> None:
        pass


def _no_dispatch(*, job: Job, countdown: float | None = None) -> None:
    """The harness runs jobs itself: nothing goes to Celery."""


def _recording(name: str, fn: Callable[..., Any], calls: list[Call], depth: list[int]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if depth[0] == 0:
            calls.append(_call_of(name, args, kwargs))
        depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1

    return call


def _call_of(name: str, args: tuple, kwargs: dict[str, Any]) -> Call:
    if "key" in kwargs:
        key, rest = kwargs["key"], (list(args), {k: v for k, v in kwargs.items() if k != "key"})
    else:
        key, rest = (args[0] if args else ""), (list(args[1:]), kwargs)
    text = json.dumps(rest, default=_describe, sort_keys=True)
    shown = ", ".join(
        [json.dumps(value, default=_describe)[:80] for value in rest[0] if not _is_function(value)]
        + [f"{k}={json.dumps(v, default=_describe)[:80]}" for k, v in sorted(rest[1].items()) if not _is_function(v)]
    )
    return Call(method=name, key=str(key), digest=hashlib.sha256(text.encode()).hexdigest()[:16], shown=shown)


def _is_function(value: Any) -> bool:
    return callable(value) and not isinstance(value, type)


def _describe(value: Any) -> Any:
    if isinstance(value, type):
        return f"<{value.__module__}.{value.__qualname__}>"
    if callable(value):
        return "<function>"
    if typed.is_model(type(value)):
        return typed.to_json(value)
    if is_dataclass(value):
        return asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


def _compare(expected: list[Call], actual: list[Call], *, job: Job, what: str, against: str) -> None:
    """`actual` must repeat `expected` call for call, as far as both go."""
    for index, (want, got) in enumerate(zip(expected, actual, strict=False), 1):
        if want != got:
            raise NonDeterminism(
                f"{job.kind} {job.pk} is not deterministic: in {what}, ctx call #{index} was {got} where "
                f"{against} made {want}. {REPLAY_RULE}"
            )


def _short(value: Any) -> str:
    text = json.dumps(value, default=_describe, sort_keys=True)
    return text if len(text) <= 200 else text[:200] + "…"
