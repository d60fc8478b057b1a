"""How `jobs.testing.run_kind` plays waits in-process (a harness driver, registered by
`waits.extensions`): `ctx.wait_for` talks to a double of the outside service that answers with
the test's `wait_results[key]`; when that answer is final the double "calls back" through the
wake token (the real `wake_token_redeem`), otherwise the test clock moves to the wait's next
backup mark and beat's due pass (`waits_resume_due`) resumes the job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.models import Job
from jobs.testing import NEVER, Pending, WaitFailed
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import waits_resume_due, wake_token_redeem


@dataclass
class ServiceDouble:
    """The fake service of one wait of one job, kept across the job's runs."""

    job: Job
    key: str
    run: Any
    token: str | None = None
    checks: int = 0
    called_back: bool = False

    def submit(self, token: str, callback_url: str | None) -> str:
        self.run.wait_result_for(self.key, self.job)  # a missing result fails the test here, clearly
        self.token = token
        return f"jobs.testing:{self.key}"

    def check(self, external_id: str) -> CheckResult:
        self.checks += 1
        return self.outcome(self.checks)

    def outcome(self, number: int) -> CheckResult:
        """What the service answers to check `number` (1, 2, …)."""
        given = self.run.wait_result_for(self.key, self.job)
        progress = None
        if isinstance(given, Pending):
            if number <= given.checks:
                return CheckResult.pending(progress=given.progress, text="pending (jobs.testing)")
            progress, given = given.progress, given.then
        if given is NEVER:
            return CheckResult.pending(progress=progress, text="never finishes (jobs.testing)")
        if isinstance(given, WaitFailed):
            return CheckResult.failed(given.reason)
        return CheckResult.succeeded(given)


def _double(run: Any, job: Job, key: str) -> ServiceDouble:
    doubles = run.state.setdefault("waits", {})
    if (job.pk, key) not in doubles:
        doubles[(job.pk, key)] = ServiceDouble(job=job, key=key, run=run)
    return doubles[(job.pk, key)]


def install_service_doubles(ctx: Any, run: Any) -> None:
    """Make this run's `ctx.wait_for` call the double instead of the author's submit and check."""
    real = ctx.wait_for

    def wait_for(key: str, *, submit: Any = None, check: Any = None, **options: Any) -> Any:
        double = _double(run, ctx.job, key)
        return real(key, submit=double.submit, check=double.check, **options)

    ctx.wait_for = wait_for


def resume_waiting_job(job: Job, run: Any) -> bool:
    """Deliver the callback of `job`'s active wait when the service's answer is final, else move
    the clock to its next due time and run beat's due pass. False when it has no active wait (a
    parent gathering its children, say)."""
    wait = Wait.objects.filter(job=job, state__in=Wait.ACTIVE).order_by("pk").first()
    if wait is None:
        return False
    double = _double(run, job, wait.key)
    final = double.outcome(double.checks + 1).state != "pending"
    if wait.state == Wait.State.WAITING and wait.mode == Wait.Mode.CALLBACK and final and not double.called_back:
        double.called_back = True
        wake_token_redeem(token=double.token)
        return True
    if wait.next_due_at is None:
        return False
    run.clock.advance_to(wait.next_due_at)
    return waits_resume_due() > 0
