"""Submitting jobs: one with an idempotency key (the API, the admin, `ctx.spawn`-style callers),
or many in one transaction (`manage.py submit --count`)."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from jobs.errors import IdempotencyConflict, InvalidInput, UnknownKind
from jobs.events import job_create_with_first_event, jobs_create_with_first_events, one_statement_write
from jobs.models import Job
from jobs.registry import kind_get
from jobs.services import transitions
from jobs.services.reconciling import jobs_statistics_refresh

Status = Job.Status
logger = logging.getLogger(__name__)


def request_digest(*, kind: str, input: Any) -> str:
    """A stable digest of a submission, to tell a repeated request from a different one."""
    canonical = json.dumps({"kind": kind, "input": input}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_submit(
    *,
    kind: str,
    input: dict[str, Any] | None = None,
    owner: Any = None,
    idempotency_key: str | None = None,
) -> tuple[Job, bool]:
    """Validate and create a `pending` job, dispatched once the transaction commits.

    Returns `(job, created)`. With an `idempotency_key` (scoped to `owner`), a repeat of the
    same request returns the existing job with `created=False`, and the same key with another
    kind or input raises IdempotencyConflict. Raises UnknownKind or InvalidInput (naming the
    field) for bad requests.
    """
    job_kind = kind_get(kind)
    input = {} if input is None else input
    job_kind.validate_input(input)
    owner_id = getattr(owner, "pk", owner)
    if idempotency_key is not None:
        existing = _job_for_idempotency_key(owner_id=owner_id, key=idempotency_key, kind=kind, input=input)
        if existing is not None:
            return existing, False
    max_attempts = attempt_budget(kind)
    # The job and its first event are one statement on PostgreSQL: no transaction of its own is
    # needed, except a savepoint inside a caller's transaction when a racing twin's key may
    # refuse the INSERT (the caller's transaction must survive that to return the twin).
    keeps_caller_usable = idempotency_key is not None and transaction.get_connection().in_atomic_block
    try:
        with transaction.atomic() if keeps_caller_usable else one_statement_write():
            job = job_create_with_first_event(kind=kind, input=input, owner_id=owner_id,
                                              idempotency_key=idempotency_key, max_attempts=max_attempts)
            transaction.on_commit(lambda: transitions.job_dispatch(job=job), robust=True)
    except IntegrityError:
        # Two identical requests raced; the unique constraint let one through.
        if idempotency_key is None:
            raise
        existing = _job_for_idempotency_key(owner_id=owner_id, key=idempotency_key, kind=kind, input=input)
        if existing is None:
            raise
        return existing, False
    return job, True


def jobs_submit_many(*, kind: str, inputs: list[dict[str, Any]], owner: Any = None) -> list[Job]:
    """Validate and create one `pending` job per input, in one transaction (the jobs and their
    first events one statement on PostgreSQL), each dispatched once the transaction commits.

    For batches (`manage.py submit --count`, imports): a job costs a fraction of `job_submit`'s
    round trips. All or nothing: an invalid input raises InvalidInput naming its index
    (`inputs[3].amount: ...`) and no job is created. No idempotency keys here.
    """
    job_kind = kind_get(kind)
    for index, value in enumerate(inputs):
        try:
            job_kind.validate_input(value)
        except InvalidInput as exc:
            field = f"inputs[{index}]{exc.field.removeprefix('input')}"
            raise InvalidInput(f"{field}{exc.message.removeprefix(exc.field)}", field=field) from None
    owner_id = getattr(owner, "pk", owner)
    max_attempts = attempt_budget(kind)
    with transaction.atomic():
        jobs = jobs_create_with_first_events(
            shared={"kind": kind, "owner_id": owner_id, "idempotency_key": None, "max_attempts": max_attempts,
                    "parent_id": None, "spawn_key": None},
            each=("input",), rows=[(value,) for value in inputs])
        transitions.jobs_dispatch_after_commit(jobs)  # their messages go out together after the commit
    # A batch into young tables: their statistics taken again now, before the workers run these
    # jobs on plans made for a table of a few rows (jobs.services.reconciling).
    jobs_statistics_refresh(rows_added=len(jobs))
    return jobs


def attempt_budget(kind: str) -> int:
    try:
        configured = kind_get(kind).max_attempts
    except UnknownKind:
        configured = None
    return configured or settings.JOBS_DEFAULT_MAX_ATTEMPTS


def _job_for_idempotency_key(*, owner_id: Any, key: str, kind: str, input: Any) -> Job | None:
    job = Job.objects.filter(owner_id=owner_id, idempotency_key=key).first()
    if job is None:
        return None
    if request_digest(kind=job.kind, input=job.input) != request_digest(kind=kind, input=input):
        raise IdempotencyConflict(
            f"idempotency_key {key!r} was already used for job {job.pk} with a different kind or input; "
            "use a new key for a new job",
            field="idempotency_key",
        )
    return job

