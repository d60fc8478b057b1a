"""What job authors use: the context a handler gets, and the exceptions that steer a run.

A handler is `handler(ctx, input)`. It may run more than once: after a retry, after a person
answers a question, after a crash. **The replay rule: code outside `ctx.step` runs again on
every resume; code inside a finished `ctx.step` does not** (its stored result is returned).
So put every side effect (a charge, an e-mail, a call to another system) inside a step, and
keep the code between steps cheap and deterministic.

    @job_kind("docs.publish", input_schema={...})
    def publish(ctx, input):
        draft = ctx.step("draft", lambda: render(input["doc"]))
        answer = ctx.ask("approve", "Publish this?", schema=APPROVAL, details={"draft": draft})
        if not answer["approved"]:
            return {"published": False}
        url = ctx.step("publish", lambda: upload(draft))
        return {"published": True, "url": url}
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from jobs.events import RunLost, event_append
from jobs.models import Job

if TYPE_CHECKING:
    from approvals.models import Question

logger = logging.getLogger(__name__)

__all__ = ["HandBack", "JobContext", "JobFailure", "ParkForWait", "PauseForResolution", "RunLost"]


class PauseForResolution(BaseException):
    """Raised by `ctx.ask` when its question has no answer yet: the run stops, the job becomes
    `paused` and holds no worker until a person answers.

    A BaseException so that a handler's `except Exception` cannot swallow it by accident.
    """

    def __init__(self, question: dict[str, Any]) -> None:
        super().__init__(f"waiting for an answer to {question['key']!r}")
        self.question = question


class ParkForWait(BaseException):
    """Raised by `ctx.wait_for` when the job must wait for outside work (accepted, throttled, or
    still pending): the run stops, the job becomes `waiting` and holds no worker until a callback,
    a backup check or a person wakes it.

    `apply()` writes the wait's row in the transaction that parks the job and returns True when
    the wait is already due (its callback came while the run was still going).
    """

    def __init__(self, *, key: str, apply: Callable[[], bool], message: dict[str, Any]) -> None:
        super().__init__(f"waiting on {key!r}")
        self.key = key
        self.apply = apply
        self.message = message


class HandBack(BaseException):
    """Raised at a `ctx` call when the worker is shutting down (SIGTERM): the run stops between
    two steps and the job goes back to `pending`, to go on in another worker from its last
    finished step. The handed-back run does not count against the job's attempts."""


class JobFailure(Exception):
    """Raise it from job code to fail the job at once with your own error code (no retry).

    `record`, when given, is called in the transaction that fails the job (platform code uses it
    to mark a wait failed together with its job).
    """

    def __init__(self, code: str, message: str, *, record: Callable[[], None] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.record = record


def question_digest(*, prompt: str, schema: dict, details: Any) -> str:
    """The digest of what a reviewer is shown: a re-run must ask exactly the same question."""
    canonical = json.dumps({"prompt": prompt, "schema": schema, "details": details}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


class JobContext:
    """The handle a job's handler gets. Every write is fenced to this run: once the job is
    cancelled (or handed to another run) the next call raises `RunLost` and the run stops."""

    # At most one progress row per this many seconds per run; later reports in between are
    # coalesced (the latest wins) so a tight loop cannot flood the database.
    progress_interval: float = 0.1

    def __init__(self, job: Job, *, worker_hostname: str = "") -> None:
        self.job = job
        # The Celery worker running this, and whether it asked for the job back (draining):
        # set by the lease heartbeat thread (`jobs.leases`), acted on at the next ctx call.
        self.worker_hostname = worker_hostname
        self.hand_back_requested = False
        self.job_id = job.pk
        self.input = job.input
        self.attempt = job.attempts
        self._checkpoint: dict[str, Any] = dict(job.checkpoint or {})
        self._progress_written_at = float("-inf")  # time.monotonic() of the last progress row
        self._progress_pending: tuple[float, str] | None = None

    # -- steps ---------------------------------------------------------------------------
    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run `fn()` once for this job and return its result.

        The result must be JSON; it is checkpointed when `fn` returns. When the step already
        finished in an earlier run, `fn` is not called and the stored result is returned.
        If `fn` raises, nothing is stored and the exception propagates (the job retries or
        fails as its kind says).
        """
        if name in self._checkpoint:
            self._event("step", step=name, status="skipped")
            return self._checkpoint[name]
        self._hand_back_if_asked()
        self._event("step", step=name, status="started")
        try:
            value = fn()
            json.dumps(value)
        except TypeError as exc:
            self._event("step", step=name, status="failed", message={"error": f"result is not JSON: {exc}"})
            raise JobFailure("step_result_not_json", f"step {name!r} returned a value that is not JSON: {exc}") from exc
        except Exception as exc:
            self._event("step", step=name, status="failed", message={"error": f"{type(exc).__name__}: {exc}"})
            raise
        self._checkpoint[name] = value
        self._event("step", step=name, status="completed", fields={"checkpoint": self._checkpoint})
        return value

    # -- progress and logs ------------------------------------------------------------------
    def progress(self, fraction: float, text: str = "") -> None:
        """Report how far the job is (0.0 to 1.0) with a short text for people watching.

        Cheap to call often: at most one `progress` event is written per `progress_interval`
        (100 ms); a report in between is held, replaced by any later one, and written before
        the run's next other event or when the run ends, so the last report is never lost.
        """
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction must be between 0 and 1, not {fraction}")
        text = str(text)[:500]
        self._hand_back_if_asked()
        if time.monotonic() - self._progress_written_at < self.progress_interval:
            self._progress_pending = (fraction, text)
            return
        self._progress_pending = None
        self._progress_write(fraction, text)

    def flush(self) -> None:
        """Write a held progress report now (the runner calls this when the handler returns)."""
        if self._progress_pending is not None:
            fraction, text = self._progress_pending
            self._progress_pending = None
            self._progress_write(fraction, text)

    def _progress_write(self, fraction: float, text: str) -> None:
        self._progress_written_at = time.monotonic()
        event_append(
            job_id=self.job_id, type="progress", message={"fraction": fraction, "text": text},
            fields={"progress_fraction": fraction, "progress_text": text}, run_attempt=self.attempt,
        )

    def log(self, text: str, level: str = "info") -> None:
        """Add a line to the job's event log (and to the worker's log)."""
        self._hand_back_if_asked()
        logger.log(logging.getLevelNamesMapping().get(level.upper(), logging.INFO), "job %s: %s", self.job_id, text)
        self._event("log", status=level, message={"text": str(text)})

    # -- questions ---------------------------------------------------------------------------
    def ask(
        self,
        key: str,
        prompt: str,
        *,
        schema: dict | None = None,
        details: Any = None,
        assignees: str | list[str] | None = None,
        required_approvals: int = 1,
        timeout: float | timedelta | None = None,
        on_timeout: Any = None,
    ) -> Any:
        """Ask a person; return their answer once there is one.

        The first time, this raises `PauseForResolution`: the job is `paused` with the question
        open, and the worker moves on. When the answer (validated against `schema`) arrives,
        the job runs again from the top and this call returns the answer. `key` names the
        question within the job and must be stable across runs. If a re-run asks the same key
        with another prompt, schema or details, the job fails with `question_changed` rather
        than reuse an answer given to something else.

        `schema` is a JSON Schema, usually from `approvals.schemas` (`approval()`, `choice(...)`,
        `multiple_choice(...)`, `text(...)`, `form(...)`); default: approve/reject with an
        optional reason. `assignees` are usernames and `"group:name"`s (default: the group
        `reviewers`); `required_approvals` distinct reviewers must approve an approval question
        (any rejection decides at once). After `timeout` (seconds or a timedelta) beat applies
        `on_timeout` (`approvals.policies`: `Default(answer)`, `Fail()` (the default),
        `Cancel()`, `Escalate(to=..., timeout=...)`). A mistake in these fails the job with
        `invalid_question` or `unknown_assignee`. A question that was cancelled or expired is
        asked again when a person retries the job.
        """
        from approvals.models import Question
        from approvals.schemas import APPROVAL_SCHEMA
        from approvals.services import question_spec_build

        schema = schema if schema is not None else APPROVAL_SCHEMA
        details = details if details is not None else {}
        digest = question_digest(prompt=prompt, schema=schema, details=details)
        question = Question.objects.filter(job_id=self.job_id, key=key).first()
        if question is not None and question.digest != digest:
            raise JobFailure(
                "question_changed",
                f"question {key!r} was asked again with a different prompt, schema or details; "
                "the stored answer was given to the old question and is not reused",
            )
        if question is not None and question.status == Question.Status.ANSWERED:
            return question.answer
        if question is not None and question.status == Question.Status.OPEN:
            raise PauseForResolution(
                {"key": key, "prompt": prompt, "schema": schema, "details": details, "digest": digest}
            )
        # New, or cancelled/expired and asked again after a retry: check what the author passed.
        raise PauseForResolution(
            question_spec_build(
                key=key, prompt=prompt, schema=schema, details=details, digest=digest, assignees=assignees,
                required_approvals=required_approvals, timeout=timeout, on_timeout=on_timeout,
            )
        )

    def question(self, key: str) -> Question | None:
        """The stored question `key` of this job (who answered it and when), or None."""
        from approvals.models import Question

        return Question.objects.select_related("answered_by").filter(job_id=self.job_id, key=key).first()

    # -- external work ---------------------------------------------------------------------------
    def wait_for(self, key: str, *, submit: Callable[[str, str | None], Any], check: Callable[[str], Any],
                 policy: Any = None, service: str = "") -> Any:
        """Hand work to an outside service and return its result, without holding a worker.

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
        """
        from waits.runtime import wait_for

        self.flush()
        return wait_for(self, key, submit=submit, check=check, policy=policy, service=service)

    # -- internals ---------------------------------------------------------------------------
    def _hand_back_if_asked(self) -> None:
        """Stop here, between two steps, when the worker is draining (see `HandBack`)."""
        if self.hand_back_requested:
            self.flush()
            raise HandBack(f"worker {self.worker_hostname} is shutting down")

    def _event(self, type: str, *, step: str = "", status: str = "", message: dict | None = None,
               fields: dict | None = None) -> None:
        self.flush()  # a held progress report goes first: the log keeps the order things happened
        event_append(
            job_id=self.job_id, type=type, step=step, status=status, message=message, fields=fields,
            run_attempt=self.attempt,
        )
