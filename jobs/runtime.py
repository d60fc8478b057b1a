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
from typing import TYPE_CHECKING, Any

from jobs.events import RunLost, event_append
from jobs.models import Job

if TYPE_CHECKING:
    from approvals.models import Question

logger = logging.getLogger(__name__)

__all__ = ["JobContext", "JobFailure", "PauseForResolution", "RunLost"]


class PauseForResolution(BaseException):
    """Raised by `ctx.ask` when its question has no answer yet: the run stops, the job becomes
    `paused` and holds no worker until a person answers.

    A BaseException so that a handler's `except Exception` cannot swallow it by accident.
    """

    def __init__(self, question: dict[str, Any]) -> None:
        super().__init__(f"waiting for an answer to {question['key']!r}")
        self.question = question


class JobFailure(Exception):
    """Raise it from job code to fail the job at once with your own error code (no retry)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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

    def __init__(self, job: Job) -> None:
        self.job = job
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
    ) -> Any:
        """Ask a person; return their answer once there is one.

        The first time, this raises `PauseForResolution`: the job is `paused` with the question
        open, and the worker moves on. When the answer (validated against `schema`) arrives,
        the job runs again from the top and this call returns the answer. `key` names the
        question within the job and must be stable across runs. If a re-run asks the same key
        with another prompt, schema or details, the job fails with `question_changed` rather
        than reuse an answer given to something else.
        """
        from approvals.models import Question
        from approvals.schemas import APPROVAL_SCHEMA

        schema = schema if schema is not None else APPROVAL_SCHEMA
        details = details if details is not None else {}
        digest = question_digest(prompt=prompt, schema=schema, details=details)
        question = Question.objects.filter(job_id=self.job_id, key=key).first()
        if question is None:
            raise PauseForResolution(
                {"key": key, "prompt": prompt, "schema": schema, "details": details, "digest": digest}
            )
        if question.digest != digest:
            raise JobFailure(
                "question_changed",
                f"question {key!r} was asked again with a different prompt, schema or details; "
                "the stored answer was given to the old question and is not reused",
            )
        if question.status == Question.Status.ANSWERED:
            return question.answer
        if question.status == Question.Status.OPEN:
            raise PauseForResolution(
                {"key": key, "prompt": prompt, "schema": schema, "details": details, "digest": digest}
            )
        raise JobFailure(f"question_{question.status}", f"question {key!r} is {question.status}")

    def question(self, key: str) -> Question | None:
        """The stored question `key` of this job (who answered it and when), or None."""
        from approvals.models import Question

        return Question.objects.select_related("answered_by").filter(job_id=self.job_id, key=key).first()

    # -- internals ---------------------------------------------------------------------------
    def _event(self, type: str, *, step: str = "", status: str = "", message: dict | None = None,
               fields: dict | None = None) -> None:
        self.flush()  # a held progress report goes first: the log keeps the order things happened
        event_append(
            job_id=self.job_id, type=type, step=step, status=status, message=message, fields=fields,
            run_attempt=self.attempt,
        )
