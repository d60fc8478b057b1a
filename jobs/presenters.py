"""How jobs and their events are shown: the JSON shape of a job (the contract's job object), the
one sentence each event reads as, and JSON as people read it.

Plain functions, shared by the consumers, the broadcast, the API, the pages and the admin. An
event's sentence is made here once and travels with the event (`text` in its JSON), so the job
page, the admin and the live script (`jobs/static/jobs/live.js`) cannot word it differently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from jobs.timestamps import iso_utc

if TYPE_CHECKING:  # the models import this module for `event_text`
    from jobs.models import Job

# Errors recorded before tracebacks were kept apart carried one inside their message.
_TRACEBACK_START = "\nTraceback (most recent call last):"


def job_error_public(error: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's error as its owner, pages and webhooks see it: `code` and `message`, never the
    Python traceback (kept on the row for the admin and in the logs)."""
    if not error:
        return error
    message = str(error.get("message", "")).split(_TRACEBACK_START, 1)[0].rstrip("\n")
    return {"code": error.get("code"), "message": message}


def job_as_dict(job: Job) -> dict[str, Any]:
    """`id`, `kind`, `status`, `input`, `result`, `error`, `progress`, `attempts`, times and
    `parent` (the API's `children` list costs a query, so pushes leave it out)."""
    return {
        "id": str(job.pk),
        "kind": job.kind,
        "status": job.status,
        "input": job.input,
        "result": job.result,
        "error": job_error_public(job.error),
        "progress": {"fraction": job.progress_fraction, "text": job.progress_text},
        "attempts": job.attempts,
        "created_at": iso_utc(job.created_at),
        "updated_at": iso_utc(job.updated_at),
        "started_at": iso_utc(job.started_at),
        "finished_at": iso_utc(job.finished_at),
        "parent": str(job.parent_id) if job.parent_id else None,
    }


# -- events as sentences -----------------------------------------------------------------------
TEXT_MAX = 300  # characters of a sentence; a long error or answer is cut


def _quoted(name: Any) -> str:
    return f"“{name}”"


def _clock(value: Any) -> str:
    """`2026-12-01T11:22:05.123Z` as `11:22:05 UTC`; anything else as it is."""
    if isinstance(value, str) and len(value) >= 19 and value[10] == "T":
        return f"{value[11:19]} UTC"
    return str(value)


def _seconds(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:g} s" if number < 120 else f"{number / 60:.0f} min"


def _error(error: Any) -> str:
    if isinstance(error, Mapping):
        code, message = error.get("code"), error.get("message")
        return " — ".join(str(part) for part in (code, message) if part) or "an error"
    return str(error)


def _answer(answer: Any) -> str:
    """An answer in a few words: approved / rejected (with the reason), else compact JSON."""
    if isinstance(answer, Mapping) and isinstance(answer.get("approved"), bool):
        verdict = "approved" if answer["approved"] else "rejected"
        return f"{verdict}: {answer['reason']}" if answer.get("reason") else verdict
    if isinstance(answer, str):
        return answer
    return json.dumps(answer, sort_keys=True, separators=(", ", ": "))


def _by(message: Mapping, word: str = "by") -> str:
    who = message.get("by") or message.get("user")
    return f" {word} {who}" if who else ""


def _status_text(status: str, message: Mapping) -> str:
    if status == "pending":
        if "error" in message and "retry_in" in message:
            return (f"Attempt {message.get('attempt', '?')} failed ({_error(message['error'])}); "
                    f"retrying in {_seconds(message['retry_in'])}")
        if message.get("lease_expired"):
            return f"The worker of attempt {message.get('attempt', '?')} was lost; queued again"
        if message.get("handed_back"):
            reason = f" ({message['reason']})" if message.get("reason") else ""
            return f"Handed back by its worker{reason}; queued again"
        if message.get("retry"):
            return f"Retried{_by(message)}; queued"
        if message.get("answered"):
            return f"Question {_quoted(message['answered'])} answered; queued to resume"
        if message.get("wait"):
            return f"Woken{_by(message)} from {_quoted(message['wait'])}; queued to resume"
        if message.get("by") == "callback":
            return "The callback came before the job had parked; queued to resume"
        return "Submitted; waiting for a worker"
    if status == "processing":
        return "Running"
    if status == "paused":
        question = f" to {_quoted(message['question'])}" if message.get("question") else ""
        return f"Paused: waiting for an answer{question}"
    if status == "waiting":
        wait = f" on {_quoted(message['wait'])}" if message.get("wait") else ""
        reason = f" ({message['reason']})" if message.get("reason") else ""
        return f"Parked: waiting{wait}{reason}"
    if status == "completed":
        return "Completed"
    if status == "failed":
        return f"Failed: {_error(message['error'])}" if message.get("error") else "Failed"
    if status == "cancelled":
        return f"Cancelled{_by(message)}"
    return f"Status: {status}"


def _progress_text(message: Mapping) -> str:
    fraction = message.get("fraction")
    percent = f"{round(float(fraction) * 100)} %" if isinstance(fraction, int | float) else ""
    return " · ".join(part for part in (percent, str(message.get("text") or "")) if part) or "Progress"


def _step_text(step: str, status: str, message: Mapping) -> str:
    name = _quoted(step)
    if status == "started":
        return f"Step {name} started"
    if status == "completed":
        return f"Step {name} done"
    if status == "skipped":
        return f"Step {name} skipped: already done"
    if status == "failed":
        return f"Step {name} failed: {message['error']}" if message.get("error") else f"Step {name} failed"
    return f"Step {name}: {status}"


def _question_text(key: str, status: str, message: Mapping) -> str:
    name = _quoted(key)
    if status == "open":
        again = f" again (round {message['round']})" if (message.get("round") or 1) > 1 else ""
        who = ", ".join(message.get("assignees") or [])
        to = f" of {who}" if who else ""
        due = f"; answer by {_clock(message['expires_at'])}" if message.get("expires_at") else ""
        return f"Question {name} asked{again}{to}{due}"
    if status == "answered":
        answer = f": {_answer(message['answer'])}" if "answer" in message else ""
        if message.get("on_timeout") == "default":
            return f"Question {name} answered with its default at the deadline{answer}"
        return f"Question {name} answered{_by(message)}{answer}"
    if status == "voted":
        return (f"{message.get('by') or 'A reviewer'} approved {name} "
                f"({message.get('approvals', '?')} of {message.get('required', '?')})")
    if status == "expired":
        then = f"; then {message['on_timeout']}" if message.get("on_timeout") else ""
        return f"Question {name} expired{then}"
    if status == "escalated":
        to = ", ".join(message.get("to") or [])
        return f"Question {name} escalated" + (f" to {to}" if to else "")
    if status == "cancelled":
        return f"Question {name} cancelled{_by(message)}"
    return f"Question {name}: {status}"


def _wait_text(key: str, status: str, message: Mapping) -> str:
    name = _quoted(key)
    if status == "parked":
        service = f" on {message['service']}" if message.get("service") else ""
        reason = f" ({message['reason']})" if message.get("reason") else ""
        check = f"; next check {_clock(message['next_check_at'])}" if message.get("next_check_at") else ""
        return f"Waiting{service} for {name}{reason}{check}"
    if status == "woken":
        return f"Wait {name} woken{_by(message)}"
    if status == "checked":
        outcome = message.get("outcome")
        return f"Wait {name} checked: {outcome}" if outcome else f"Wait {name} checked"
    if status == "done":
        checks = message.get("checks")
        return f"Wait {name} done" + (f" after {checks} check{'s' if checks != 1 else ''}" if checks else "")
    if status == "failed":
        return f"Wait {name} failed: {_error(message)}"
    return f"Wait {name}: {status}"


def _log_text(level: str, message: Mapping) -> str:
    text = str(message.get("text") or "")
    if level in ("", "info"):
        return text or "Log"
    return f"{level.capitalize()}: {text}"


def event_text(event: Mapping[str, Any]) -> str:
    """The event (`type`, `step`, `status`, `message`, as in its JSON) as one short sentence
    for people: `3 % · step 1 of 30`, `Step “draft” done`, `Question “approve” answered by rita:
    approved`. Never raises: an event of an unknown shape reads as its type and status."""
    kind = event.get("type") or ""
    step = event.get("step") or ""
    status = event.get("status") or ""
    message = event.get("message")
    message = message if isinstance(message, Mapping) else {}
    try:
        if kind == "status":
            text = _status_text(status, message)
        elif kind == "progress":
            text = _progress_text(message)
        elif kind == "step":
            text = _step_text(step, status, message)
        elif kind == "question":
            text = _question_text(step, status, message)
        elif kind == "wait":
            text = _wait_text(step, status, message)
        elif kind == "log":
            text = _log_text(status, message)
        else:
            text = " ".join(part for part in (kind, step, status) if part)
    except (TypeError, ValueError, KeyError, AttributeError):
        text = " ".join(part for part in (kind, step, status) if part)
    return text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 1] + "…"


# -- JSON and times for people -------------------------------------------------------------------
JSON_PREVIEW_LINES = 6


def json_pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def json_block(value: Any, *, lines: int = JSON_PREVIEW_LINES, css: str = "json") -> SafeString:
    """`value` as pretty-printed JSON in a <pre>; past `lines` lines, collapsed in a <details>
    whose summary says how long it is (the browser opens it; no script)."""
    text = json_pretty(value)
    count = text.count("\n") + 1
    if count <= lines:
        return format_html('<pre class="{}">{}</pre>', css, text)
    first = "\n".join(text.splitlines()[: lines - 1])
    return format_html(
        '<details class="json-collapsed"><summary><span class="json-summary">{} lines: show all</span>'
        '<pre class="{} json-preview" aria-hidden="true">{}\n…</pre></summary><pre class="{}">{}</pre></details>',
        count, css, first, css, text,
    )


def duration_short(seconds: float) -> str:
    """A duration in one rounded unit, as people say it: `45 s`, `5 min`, `2 h`, `3 d`."""
    seconds = abs(seconds)
    if seconds < 59.5:
        return f"{round(seconds)} s"
    if seconds < 3600 - 30:
        return f"{round(seconds / 60)} min"
    if seconds < 86400 - 1800:
        return f"{round(seconds / 3600)} h"
    return f"{round(seconds / 86400)} d"


def time_left(deadline: datetime | None, *, now: datetime | None = None) -> str:
    """`in 2 h`, or `overdue 5 min` once `deadline` has passed; "" for none."""
    if deadline is None:
        return ""
    left = (deadline - (now or timezone.now())).total_seconds()
    return f"in {duration_short(left)}" if left > 0 else f"overdue {duration_short(left)}"


def time_with_age(value: datetime | None, *, now: datetime | None = None) -> str:
    """`2026-12-01 11:22:05 UTC (3 minutes ago)`: the time to the second, and how long ago
    (or how far ahead); "—" for none."""
    if value is None:
        return "—"
    now = now or timezone.now()
    stamp = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if value <= now:
        age = timesince(value, now, depth=1)
        return f"{stamp} ({'just now' if age.startswith('0') else age + ' ago'})"
    return f"{stamp} (in {timesince(now, value, depth=1)})"
