"""The JSON shape of a job as websocket clients and pages see it (the contract's job object).

A plain function, shared by the consumers, the broadcast and the pages; the REST API's
serializer produces the same shape.
"""

from __future__ import annotations

from typing import Any

from jobs.models import Job
from jobs.timestamps import iso_utc

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
