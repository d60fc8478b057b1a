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

import logging
import time
from collections.abc import Callable
from typing import Any

from dbkit.conf import setting
from jobs.events import STEP_NOT_DONE, RunLost, event_append, step_begin, step_checkpoint, steps_finished
from jobs.models import STEP_NAME_MAX, Job
from jobs.storable import json_refusal, storable_text

logger = logging.getLogger(__name__)

__all__ = ["HandBack", "JobContext", "JobFailure", "ParkForWait", "PauseForResolution", "RunLost", "Suspend"]


class Suspend(BaseException):
    """Stop the run without finishing the job: the one suspension protocol.

    The job moves to `status` (`paused` for a person, `waiting` for an outside event) and holds
    no worker; `apply(job)` writes the feature's own rows (its question, its wait) in the very
    transaction that moves the job, and returns True when what the job waits for already came
    (the job is then runnable again at once). `message` goes into the job's `status` event.
    `on` names what the job is suspended on (`question:<key>`, `wait:<key>`): stored on the job
    (`Job.suspended_on`), so that only a wake naming it resumes the job.
    The feature apps raise subclasses of it from their `ctx` methods (`jobs.extensions`).

    A BaseException so that a handler's `except Exception` cannot swallow it by accident.
    """

    status: str = ""

    def __init__(self, reason: str, *, apply: Callable[[Job], bool | None], message: dict[str, Any] | None = None,
                 status: str | None = None, on: str = "") -> None:
        super().__init__(reason)
        self.apply = apply
        self.message = message
        self.on = on
        if status is not None:
            self.status = status
        if self.status not in (Job.Status.PAUSED, Job.Status.WAITING):
            raise ValueError(f"a run suspends into paused or waiting, not {self.status!r}")


class PauseForResolution(Suspend):
    """Raised by `ctx.ask` when its question has no answer yet: the run stops, the job becomes
    `paused` and holds no worker until a person answers. `question` is what is asked."""

    status = Job.Status.PAUSED

    def __init__(self, question: dict[str, Any], *, apply: Callable[[Job], bool | None]) -> None:
        super().__init__(f"waiting for an answer to {question['key']!r}", apply=apply,
                         message={"question": question["key"]}, on=f"question:{question['key']}")
        self.question = question


class ParkForWait(Suspend):
    """Raised by `ctx.wait_for` when the job must wait for outside work (accepted, throttled, or
    still pending): the run stops, the job becomes `waiting` and holds no worker until a callback,
    a backup check or a person wakes it."""

    status = Job.Status.WAITING

    def __init__(self, *, key: str, apply: Callable[[Job], bool | None], message: dict[str, Any]) -> None:
        super().__init__(f"waiting on {key!r}", apply=apply, message=message, on=f"wait:{key}")
        self.key = key


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


class JobContext:
    """The handle a job's handler gets. Every write is fenced to this run: once the job is
    cancelled (or handed to another run) the next call raises `RunLost` and the run stops.

    Besides the methods below, the feature apps add their own (`jobs.extensions.context_method`):
    `ctx.ask` and `ctx.question` (`approvals.runtime`), `ctx.wait_for` (`waits.runtime`).
    """

    # At most one progress row per this many seconds per run; later reports in between are
    # coalesced (the latest wins) so a tight loop cannot flood the database.
    progress_interval: float = 0.1

    def __init__(self, job: Job, *, worker_hostname: str = "") -> None:
        self.job = job
        # The Celery worker running this, and whether it asked for the job back (draining):
        # set by the lease heartbeat thread (`jobs.leases`), acted on at the next ctx call.
        self.worker_hostname = worker_hostname
        self.hand_back_requested = False
        # Set by the heartbeat when the run no longer owns the job (or its lease could not be
        # renewed in time): the next ctx call raises RunLost. `lease_until` is when the lease the
        # heartbeat last wrote ends, in this process's time.monotonic().
        self.lost = False
        self.overdue = False  # the heartbeat found it about to outlive its lease (and stops it)
        self.lease_until = time.monotonic() + setting("JOBS_LEASE_SECONDS")
        self.job_id = job.pk
        self.input = job.input
        self.attempt = job.attempts
        # The job's finished steps (`JobStep`: name → stored result), read at this run's first
        # step: a run without steps reads none.
        self._checkpoint: dict[str, Any] | None = None
        self._progress_written_at = float("-inf")  # time.monotonic() of the last progress row
        self._progress_pending: tuple[float, str] | None = None

    # -- steps ---------------------------------------------------------------------------
    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run `fn()` once for this job and return its result.

        The result must be JSON; it is checkpointed when `fn` returns. When the step already
        finished in an earlier run, `fn` is not called and the stored result is returned.
        If `fn` raises, nothing is stored and the exception propagates (the job retries or
        fails as its kind says). `name`: a non-empty string of at most 200 characters, unique
        within the job.
        """
        if not isinstance(name, str) or not 0 < len(name) <= STEP_NAME_MAX:
            raise ValueError(f"a step's name must be a non-empty string of at most {STEP_NAME_MAX} characters, "
                             f"not {name!r:.60}")
        if self._checkpoint is None:
            self._checkpoint = steps_finished(self.job_id)
        if name in self._checkpoint:
            self._event("step", step=name, status="skipped")
            return self._checkpoint[name]
        self._hand_back_if_asked()
        self.flush()
        stored = step_begin(job_id=self.job_id, run_attempt=self.attempt, step=name)
        if stored is not STEP_NOT_DONE:  # an earlier run finished it after this run began
            self._checkpoint[name] = stored
            self._event("step", step=name, status="skipped")
            return stored
        try:
            value = fn()
        except Exception as exc:
            error = storable_text(f"{type(exc).__name__}: {exc}")
            self._event("step", step=name, status="failed", message={"error": error})
            raise
        # Only the result's own shape gives this code (a TypeError raised by `fn` is its own
        # error, retried as any other), and it is checked before the step counts as done.
        refusal = json_refusal(value)
        if refusal is not None:
            self._event("step", step=name, status="failed", message={"error": f"result is not JSON: {refusal}"})
            raise JobFailure(
                "step_result_not_json",
                f"step {name!r} returned a value that cannot be stored as JSON: {refusal}; return dicts, "
                "lists, strings, finite numbers, booleans and None (dates and decimals as strings)",
            )
        self.flush()
        stored = step_checkpoint(job_id=self.job_id, run_attempt=self.attempt, step=name, value=value)
        self._checkpoint[name] = stored
        return stored

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

    # -- internals ---------------------------------------------------------------------------
    def _hand_back_if_asked(self) -> None:
        """Stop here, between two steps, when the worker is draining (see `HandBack`), or when
        the run has lost its job (`RunLost`: the heartbeat found it so)."""
        if self.lost:
            raise RunLost(f"job {self.job_id} is no longer run by attempt {self.attempt}")
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
