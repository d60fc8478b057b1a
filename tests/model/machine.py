"""A stateful model of the platform (issue 13): Hypothesis draws random interleavings of what
people, workers, beat and outside services do to jobs, and after every move the invariants that
must always hold are checked against PostgreSQL.

Moves: submit, claim, finish a step, ask, answer (several reviewers, a quorum), wait on outside
work, complete, fail, cancel, retry, expire a deadline, wake (callback), a due check, expire a
lease and reconcile, hand back, a duplicate message (the runner's own delivery path).

Runs are driven in this process one `ctx` call at a time (`tests.support.runs`), so a run can be
left half-way while other moves happen, and old runs come back to life after their job moved on.
Every service call may raise only the platform's own errors (4xx-class `PlatformError`, or
`RunLost` inside a run); anything else escaping is a server error and fails the model.

Each example runs inside a savepoint of the test's transaction and is rolled back after it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from approvals.models import Decision, Question
from approvals.policies import Cancel, Default, Escalate, Fail
from approvals.services import question_answer, question_expire
from jobs.errors import PlatformError
from jobs.models import Job, JobEvent
from jobs.runner import _record, _run, job_execute
from jobs.runtime import JobContext
from jobs.services import (
    job_cancel,
    job_claim,
    job_complete,
    job_hand_back,
    job_retry,
    job_submit,
    jobs_recover_expired_leases,
    run_lease_release,
)
from tests.conftest import make_user
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import waits_resume_due, wake_token, wake_token_redeem

S = Job.Status
STEPS = ("s1", "s2", "s3")
QUESTIONS = ("q1", "q2")
WAITS = ("w1", "w2")
POLICIES = {
    "none": None,
    "fail": Fail(),
    "cancel": Cancel(),
    "default": Default({"approved": True}),
    "escalate": Escalate(to="group:reviewers", timeout=60),
}
ANSWERED_KINDS = {Decision.Kind.ANSWERED, Decision.Kind.APPROVED, Decision.Kind.REJECTED, Decision.Kind.EXPIRED}


# What the model did, across examples (the long profile, bench/model.py, reports it).
STATS = {"examples": 0, "steps": 0, "service_calls": 0, "platform_errors": 0}


class _Continue(BaseException):  # noqa: N818 (a signal, not an error)
    """Leaves `_run` with the value of a ctx call that did not end the run."""

    def __init__(self, value: Any) -> None:
        self.value = value


class PlatformModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._savepoint = transaction.savepoint()
        self.owner = make_user("model-owner")
        self.reviewers = [make_user(f"model-reviewer-{n}", reviewer=True) for n in range(3)]
        self.jobs: list[Any] = []
        self.runs: list[JobContext] = []  # runs in progress: claimed, not ended (some may have lost their job)
        self.steps: dict[tuple[Any, str], Any] = {}  # (job, step) -> the result first seen stored
        self.outside: dict[tuple[Any, str], str] = {}  # (job, wait) -> what the outside service says
        self.moves = 0
        STATS["examples"] += 1

    def teardown(self) -> None:
        STATS["service_calls"] += self.moves
        transaction.savepoint_rollback(self._savepoint)

    # -- helpers ---------------------------------------------------------------------------------
    def call(self, fn, *args, **kwargs) -> Any:
        """A service call: the platform's own errors are answers (4xx); anything else fails."""
        self.moves += 1
        try:
            return fn(*args, **kwargs)
        except PlatformError as exc:
            STATS["platform_errors"] += 1
            return exc

    def drive(self, ctx: JobContext, body) -> tuple[str, Any]:
        """Do `body(ctx)` inside the run `ctx` as a handler would, recording an outcome that ends
        the run (a suspension, a failure, a hand-back, a result) exactly as the runner does.
        Returns ("ended", what the runner returned) or ("going", the call's value)."""
        self.moves += 1

        def handler(ctx, input):
            raise _Continue(body(ctx))

        kind = type("Kind", (), {"handler": staticmethod(handler), "call": staticmethod(handler), "time_limit": None,
                                 "on_time_limit": "fail"})
        try:
            outcome = _run(kind, ctx, ctx.job)
        except _Continue as going:
            return "going", going.value
        except PlatformError as exc:  # an outcome service refused (e.g. the job was cancelled)
            outcome = exc
        self.runs.remove(ctx)
        return "ended", outcome

    def end(self, ctx: JobContext, service, **kwargs) -> Any:
        """End the run with an outcome service, through the runner's recorder."""
        self.moves += 1
        self.runs.remove(ctx)
        return _record(service, job=ctx.job, **kwargs)

    def jobs_in(self, *statuses: str) -> list[Any]:
        return list(Job.objects.filter(pk__in=self.jobs, status__in=statuses).values_list("pk", flat=True))

    # -- moves: people and integrations ------------------------------------------------------------
    @rule()
    def submit(self) -> None:
        job, _ = self.call(job_submit, kind="test.model", input={}, owner=self.owner)
        self.jobs.append(job.pk)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data) -> None:
        self.call(job_cancel, job_id=data.draw(st.sampled_from(self.jobs)), actor=self.owner, channel="api")

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def retry(self, data) -> None:
        self.call(job_retry, job_id=data.draw(st.sampled_from(self.jobs)), actor=self.owner)

    @precondition(lambda self: Question.objects.filter(job__in=self.jobs, status=Question.Status.OPEN).exists())
    @rule(data=st.data(), approve=st.booleans())
    def answer(self, data, approve) -> None:
        question = data.draw(st.sampled_from(list(
            Question.objects.filter(job__in=self.jobs, status=Question.Status.OPEN).order_by("created_at"))))
        reviewer = data.draw(st.sampled_from(self.reviewers))
        answer = {"approved": True} if approve else {"approved": False, "reason": "no"}
        self.call(question_answer, question_id=question.pk, user=reviewer, answer=answer, channel="api")

    # -- moves: workers ----------------------------------------------------------------------------
    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def claim(self, data) -> None:
        """A worker takes the job's message (any job: a duplicate message finds it taken)."""
        claimed = self.call(job_claim, job_id=data.draw(st.sampled_from(self.jobs)), worker="model")
        if isinstance(claimed, Job):
            self.runs.append(JobContext(claimed))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def duplicate_message(self, data) -> None:
        """The runner's whole delivery path for a job, in whatever state it is."""
        self.call(job_execute, job_id=data.draw(st.sampled_from(self.jobs)), worker="model-dup")

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), step=st.sampled_from(STEPS), value=st.integers(0, 3))
    def finish_a_step(self, data, step, value) -> None:
        ctx = data.draw(st.sampled_from(self.runs))
        self.drive(ctx, lambda ctx: ctx.step(step, lambda: {"by": ctx.attempt, "value": value}))

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), key=st.sampled_from(QUESTIONS), quorum=st.sampled_from([1, 2]),
          policy=st.sampled_from(sorted(POLICIES)))
    def ask(self, data, key, quorum, policy) -> None:
        ctx = data.draw(st.sampled_from(self.runs))
        on_timeout = POLICIES[policy]
        self.drive(ctx, lambda ctx: ctx.ask(
            key, f"Question {key}?", required_approvals=quorum,
            timeout=3600 if on_timeout is not None else None, on_timeout=on_timeout))

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), key=st.sampled_from(WAITS))
    def wait_for(self, data, key) -> None:
        ctx = data.draw(st.sampled_from(self.runs))
        job_id = ctx.job_id

        def check(external_id):
            said = self.outside.get((job_id, key), "pending")
            return {"pending": CheckResult.pending(), "succeeded": CheckResult.succeeded({"key": key}),
                    "failed": CheckResult.failed("the model said so")}[said]

        self.drive(ctx, lambda ctx: ctx.wait_for(key, submit=lambda token, url: f"{job_id}-{key}", check=check))

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def complete(self, data) -> None:
        self.end(data.draw(st.sampled_from(self.runs)), job_complete, result={"done": True})

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def fail(self, data) -> None:
        ctx = data.draw(st.sampled_from(self.runs))

        def raises(ctx):
            raise RuntimeError("the model's run failed")

        self.drive(ctx, raises)

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def hand_back(self, data) -> None:
        self.end(data.draw(st.sampled_from(self.runs)), job_hand_back, reason="the model's worker shuts down")

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def run_notices(self, data) -> None:
        """A run reaches a ctx call (a progress report): a run that lost its job stops there."""
        ctx = data.draw(st.sampled_from(self.runs))
        self.drive(ctx, lambda ctx: ctx.progress(0.5, "half way"))

    # -- moves: beat and the outside world -----------------------------------------------------------
    @precondition(lambda self: Question.objects.filter(job__in=self.jobs, status="open",
                                                       expires_at__isnull=False).exists())
    @rule(data=st.data())
    def expire_a_deadline(self, data) -> None:
        question = data.draw(st.sampled_from(list(Question.objects.filter(
            job__in=self.jobs, status="open", expires_at__isnull=False).order_by("created_at"))))
        self.call(question_expire, question_id=question.pk, now=timezone.now() + timedelta(days=1))

    @precondition(lambda self: Wait.objects.filter(job__in=self.jobs).exists())
    @rule(data=st.data(), outcome=st.sampled_from(["pending", "succeeded", "failed"]))
    def outside_service_says(self, data, outcome) -> None:
        wait = data.draw(st.sampled_from(list(Wait.objects.filter(job__in=self.jobs).order_by("created_at"))))
        self.outside[(wait.job_id, wait.key)] = outcome

    @precondition(lambda self: Wait.objects.filter(job__in=self.jobs).exists())
    @rule(data=st.data())
    def wake(self, data) -> None:
        """The outside service calls back (once, or again: a used token is refused)."""
        wait = data.draw(st.sampled_from(list(Wait.objects.filter(job__in=self.jobs).order_by("created_at"))))
        self.call(wake_token_redeem, token=wake_token(wait.token_salt))

    @precondition(lambda self: Wait.objects.filter(job__in=self.jobs, state__in=Wait.ACTIVE).exists())
    @rule(data=st.data())
    def due_check(self, data) -> None:
        wait = data.draw(st.sampled_from(list(
            Wait.objects.filter(job__in=self.jobs, state__in=Wait.ACTIVE).order_by("created_at"))))
        Wait.objects.filter(pk=wait.pk).update(next_due_at=timezone.now() - timedelta(seconds=1))
        self.call(waits_resume_due)

    @precondition(lambda self: Job.objects.filter(pk__in=self.jobs, status=S.PENDING).exists())
    @rule(data=st.data(), waiting=st.booleans())
    def back_off(self, data, waiting) -> None:
        """A pending job is in (or past) a retry back-off. The model runs with no back-off at all
        (its draws must not depend on the clock); this puts one in, or ends it."""
        job_id = data.draw(st.sampled_from(self.jobs_in(S.PENDING)))
        Job.objects.filter(pk=job_id).update(run_after=timezone.now() + timedelta(hours=1) if waiting else None)

    @precondition(lambda self: Job.objects.filter(pk__in=self.jobs, status=S.PROCESSING).exists())
    @rule(data=st.data())
    def expire_a_lease_and_reconcile(self, data) -> None:
        """A run's worker looks dead (its lease ran out): the reconciler takes the job back. The
        run itself may still be alive in the model, and come back later."""
        job_id = data.draw(st.sampled_from(self.jobs_in(S.PROCESSING)))
        Job.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        self.call(jobs_recover_expired_leases)

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def old_run_stops(self, data) -> None:
        """A run whose job moved on ends (the runner releases its lease), as its heartbeat or its
        next ctx call would make it."""
        ctx = data.draw(st.sampled_from(self.runs))
        if Job.objects.filter(pk=ctx.job_id, status=S.PROCESSING, attempts=ctx.attempt).exists():
            return
        self.runs.remove(ctx)
        self.moves += 1
        run_lease_release(job=ctx.job)

    # -- invariants ----------------------------------------------------------------------------------
    @invariant()
    def the_invariants_hold(self) -> None:
        STATS["steps"] += 1  # after each step (and once at the start of each example)
        check_invariants(self.jobs, self.steps)


def check_invariants(job_ids: list[Any], first_results: dict[tuple[Any, str], Any]) -> None:
    """Everything that must hold after any move, whatever came before."""
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=job_ids)}
    events: dict[Any, list[JobEvent]] = {pk: [] for pk in jobs}
    for event in JobEvent.objects.filter(job__in=job_ids).order_by("job", "seq"):
        events[event.job_id].append(event)
    open_questions = set(Question.objects.filter(job__in=job_ids, status=Question.Status.OPEN)
                         .values_list("job_id", "key"))
    active_waits = set(Wait.objects.filter(job__in=job_ids, state__in=Wait.ACTIVE).values_list("job_id", "key"))
    for pk, job in jobs.items():
        log = events[pk]
        # Event seqs are gapless: 1, 2, …, event_seq.
        assert [e.seq for e in log] == list(range(1, job.event_seq + 1)), (pk, [e.seq for e in log], job.event_seq)
        # Statuses and moves are legal; the log's last status is the job's.
        moves = [e.status for e in log if e.type == "status"]
        assert moves[0] == S.PENDING, moves
        for before, after in zip(moves, moves[1:], strict=False):
            assert after in Job.TRANSITIONS[before], (pk, before, after, moves)
        assert moves[-1] == job.status, (pk, moves, job.status)
        if job.status in Job.TERMINAL:
            # A finished job's last event is its status event, and nothing waits for it.
            assert log[-1].type == "status", (pk, [(e.type, e.status) for e in log[-3:]])
            assert not any(key for job_id, key in open_questions if job_id == pk), (pk, job.status, open_questions)
            assert not any(key for job_id, key in active_waits if job_id == pk), (pk, job.status, active_waits)
        # A run's error is the job's own, never the platform's: the runner records any exception a
        # run raises (a bug in a ctx call included) as the job's `exception` error.
        if job.error and job.error.get("code") == "exception":
            assert "the model's run failed" in job.error["message"], (pk, job.error["message"][:2000])
        # No processing job without a lease.
        if job.status == S.PROCESSING:
            assert job.lease_expires_at is not None, pk
        # A suspended job waits for something that can still come.
        if job.status == S.PAUSED:
            assert job.suspended_on.startswith("question:"), job.suspended_on
            assert (pk, job.suspended_on.removeprefix("question:")) in open_questions, (pk, job.suspended_on)
        if job.status == S.WAITING:
            assert job.suspended_on.startswith("wait:"), job.suspended_on
            assert (pk, job.suspended_on.removeprefix("wait:")) in active_waits, (pk, job.suspended_on)
        # No checkpoint is overwritten: a step's stored result never changes once seen.
        checkpoint = job.checkpoint  # read once: a view of the job's step rows
        for step, value in checkpoint.items():
            seen = first_results.setdefault((pk, step), value)
            assert seen == value, (pk, step, seen, value)
        for (job_id, step), value in first_results.items():
            if job_id == pk:
                assert checkpoint.get(step) == value, (pk, step, value, checkpoint)
    # Every answered question matches its ledger.
    for question in Question.objects.filter(job__in=job_ids, status=Question.Status.ANSWERED):
        rows = list(question.decisions.filter(round=question.round).order_by("created_at", "id"))
        deciding = [row for row in rows if row.kind in ANSWERED_KINDS]
        assert deciding, (question.pk, [(r.kind, r.round) for r in rows])
        last = deciding[-1]
        assert last.answer == question.answer, (question.pk, last.answer, question.answer)
        assert last.actor_id == question.answered_by_id, (question.pk, last.actor_id, question.answered_by_id)
        if last.kind == Decision.Kind.APPROVED:
            votes = [row for row in rows if row.kind == Decision.Kind.APPROVED]
            assert len({row.actor_id for row in votes}) == len(votes) >= question.required_approvals, question.pk
