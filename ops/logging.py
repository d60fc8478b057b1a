"""Log lines that name the job they are about, in every process.

A job's id and kind live in a context variable for as long as the process works on that job:
the worker sets it around each run of `jobs.run` (`ops.signals`), the web server around each
request for a job's page or API (`ops.middleware`). `JobContextFilter`, on the console handler
of `settings.LOGGING`, copies them onto every record as `job_id` and `job_kind`, so the JSON
formatter (production) writes them as fields and `ReadableFormatter` (`make run`) shows them
in brackets. A context variable, not a thread-local: it follows asyncio tasks and
`sync_to_async` threads, and each request or run sees only its own job.
"""

from __future__ import annotations

import copy
import logging
import re
from contextvars import ContextVar, Token
from typing import Any, NamedTuple


class JobLogContext(NamedTuple):
    job_id: str
    job_kind: str


_current_job: ContextVar[JobLogContext | None] = ContextVar("taskplatform_log_job", default=None)


def job_log_context_set(*, job_id: Any, job_kind: str | None) -> Token:
    """Name `job_id` (of `job_kind`) on every line logged from here on in this context.
    Returns the token that `job_log_context_reset` takes."""
    return _current_job.set(JobLogContext(str(job_id), job_kind or ""))


def job_log_context_reset(token: Token | None = None) -> None:
    """End what `job_log_context_set` began: back to the earlier value with its `token`, or to
    no job (from another context than the one that set it, where a token cannot be used)."""
    if token is not None:
        try:
            _current_job.reset(token)
            return
        except ValueError:  # the token belongs to another context
            pass
    _current_job.set(None)


def job_log_context() -> JobLogContext | None:
    """The job the current context works on, if any."""
    return _current_job.get()


class JobContextFilter(logging.Filter):
    """Adds `job_id` and `job_kind` to each record logged while a job is current; a record that
    already carries them (an explicit `extra=`) keeps its own. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = _current_job.get()
        if current is not None and not hasattr(record, "job_id"):
            record.job_id = current.job_id
            record.job_kind = current.job_kind
        return True


# The line Celery beat logs for each pass it sends (celery/beat.py, `Scheduler.apply_entry`).
BEAT_SEND_LINE = "Scheduler: Sending due task"


class BeatSendsFilter(logging.Filter):
    """Drops Celery beat's line per pass it sends (`BEAT_SEND_LINE`): with a pass due every second
    it is most of what a quiet deployment logs. Every other line of beat's passes through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(BEAT_SEND_LINE))


class ReadableFormatter(logging.Formatter):
    """The terminal's format (`make run`): `%(job)s` is ` [kind id]` on a line a job caused and
    empty on the others, so the lines stay short when there is nothing to say."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        job_id = getattr(record, "job_id", None)
        # On a copy: another handler's formatter (JSON) must not see a `job` field appear.
        record = copy.copy(record)
        record.job = f" [{getattr(record, 'job_kind', '') or '?'} {job_id}]" if job_id else ""
        return super().formatMessage(record)


# Secrets that travel in URLs and so reach access logs: the wake token in a callback's path,
# websocket tickets, and any `...token=` in a query string.
_URL_SECRETS = [
    (re.compile(r"(/api/wake/)[^/\s?#\"']+"), r"\1[redacted]"),
    (re.compile(r"([?&][\w.-]*(?:ticket|token)=)[^&\s#\"']*", re.IGNORECASE), r"\1[redacted]"),
]
REDACTED_LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    """`text` with the secrets of URLs replaced by `[redacted]`."""
    # Every access log line passes here, its arguments one by one: most hold neither a wake path
    # nor an `=`, without which no pattern matches, and are let through without a regex.
    if "=" not in text and "/api/wake/" not in text:
        return text
    for pattern, replacement in _URL_SECRETS:
        text = pattern.sub(replacement, text)
    return text


class SecretsRedactFilter(logging.Filter):
    """Writes wake tokens, tickets and `token=` values of the URLs in a record as `[redacted]`
    (its message and its arguments: access logs pass the path as an argument). Never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: redact(arg) if isinstance(arg, str) else arg for key, arg in record.args.items()}
        return True


def server_logs_redact() -> None:
    """Put the filter on the ASGI server's own loggers (uvicorn configures them before it loads
    the application, with handlers of their own that Django's LOGGING does not reach)."""
    for name in REDACTED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, SecretsRedactFilter) for existing in logger.filters):
            logger.addFilter(SecretsRedactFilter())
