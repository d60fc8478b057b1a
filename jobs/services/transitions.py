"""The one function that changes `Job.status`, and the dispatch that sends a job to a worker.

`job_transition` checks the move against `Job.TRANSITIONS`, writes the row and its `status`
event in one statement, and runs the feature apps' transition hooks (`jobs.extensions`) in the
same transaction: the job's row is locked first, by the UPDATE, before any hook locks its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from functools import cache, partial
from typing import Any, NoReturn

import redis
from django.db import transaction
from django.db.models import Q

from jobs.broker import (
    direct_allowed,
    dispatch_mark,
    dispatch_marks_held,
    dispatch_marks_together,
    dispatch_premark,
    run_message_render,
    run_message_send,
    run_messages_push,
)
from jobs.clock import db_now
from jobs.errors import InvalidTransition, JobNotFound, UnknownKind
from jobs.events import EarlierEvent, job_update_with_event, one_statement_write
from jobs.extensions import transition_hooks_for
from jobs.models import Job
from jobs.registry import kind_get
from jobs.statements import NEXT_EVENT_SEQ, NEXT_TWO_EVENT_SEQS, MoveRows

Status = Job.Status
logger = logging.getLogger(__name__)


@cache
def _sources_for(to: str, from_: tuple[str, ...] | None) -> frozenset[str]:
    """The statuses a job may move to `to` from (narrowed to `from_` when given)."""
    sources = {source for source, targets in Job.TRANSITIONS.items() if to in targets}
    return frozenset(sources if from_ is None else sources & set(from_))


def job_transition(
    *,
    job_id: Any,
    to: str,
    from_: Iterable[str] | None = None,
    fields: dict[str, Any] | None = None,
    message: dict[str, Any] | None = None,
    dispatch: bool = False,
    countdown: float | None = None,
    only_attempt: int | None = None,
    where: Q | None = None,
    suspended_on: str | None = None,
    has_owner: bool | None = None,
    has_parent: bool | None = None,
    actor: Any = None,
    channel: str | None = None,
    before: EarlierEvent | None = None,
) -> Job:
    """Move a job to status `to` and return the updated row.

    In one transaction: a single conditional `UPDATE … RETURNING` locks the row, checks the move
    against `Job.TRANSITIONS` (narrowed to `from_` when given, to the run `only_attempt`, to a job
    suspended on `suspended_on` and to the extra condition `where` when given), writes the status
    with `fields` and the next event seq; then the `status` event is inserted. Leaving `processing`
    releases the run's lease, except for `cancelled`, where the run may still be winding down. Then
    the transition hooks registered for `to` run (`jobs.extensions.transition_hook`), with `actor`
    and `channel` (who asked, through what). `has_owner` (when the caller knows; an owner never
    changes) lets an ownerless job's move skip the transaction that owners-only hooks would need
    (see `_transition_transaction`); so does `has_parent` (a child's end wakes a parent that gathers
    it, in the same transaction: `jobs.services.family`). The times it writes (`updated_at`,
    `started_at`, `finished_at`) are the database's (`jobs.clock`). With `dispatch`, the job's
    Celery task is sent after the commit (after `countdown` seconds). Raises JobNotFound, or
    InvalidTransition naming the current status.

    `before`: an event written just before the `status` event, in the same statement (what made
    the move: a question answered, a wait woken), and only if the move is made.
    """
    sources = _sources_for(to, None if from_ is None else tuple(from_))
    now = db_now()
    values: dict[str, Any] = {"status": to, "event_seq": NEXT_EVENT_SEQ if before is None else NEXT_TWO_EVENT_SEQS,
                              "updated_at": now}
    if to == Status.PROCESSING:
        values["started_at"] = now
    if to in Job.TERMINAL:
        values["finished_at"] = now
    elif to == Status.PENDING:
        values["finished_at"] = None
        values["gathering"] = None  # runnable again: no longer parked in ctx.gather
    if to not in (Status.PROCESSING, Status.CANCELLED):
        values["lease_expires_at"] = None
    if to not in (Status.PAUSED, Status.WAITING):
        values["suspended_on"] = ""
    values.update(fields or {})

    hooks = transition_hooks_for(to, has_owner=has_owner)
    closing = [hook for hook in hooks if hook.before]
    after = [hook for hook in hooks if not hook.before]
    # A child's end wakes its gathering parent in the same transaction (jobs.services.family).
    family = to in Job.TERMINAL and has_parent is not False
    selects = {"job_id": job_id, "sources": sources, "only_attempt": only_attempt, "where": where,
               "suspended_on": suspended_on}
    written = None
    if after and not family and all(hook.needed_when is not None for hook in after):
        # First as the one statement, where no after-hook is needed (an owner without webhooks):
        # matching nothing writes nothing, and the move then takes its transaction below.
        quiet = MoveRows(**selects, unless_needed=tuple(after), no_feature_rows=bool(closing))
        with one_statement_write():
            written = job_update_with_event(rows=quiet, fields=values, type="status", status=to, message=message,
                                            before=before)
    if written is None:
        with _transition_transaction(alone=not after and not family):
            if closing:
                # A job that holds no feature rows has nothing to close: the one statement, as usual.
                written = job_update_with_event(rows=MoveRows(**selects, no_feature_rows=True), fields=values,
                                                type="status", status=to, message=message, before=before)
                if written is None:
                    written = _move_closing_first(MoveRows(**selects), closing, job_id=job_id, to=to, fields=values,
                                                  message=message, actor=actor, channel=channel, before=before)
            else:
                written = job_update_with_event(rows=MoveRows(**selects), fields=values, type="status", status=to,
                                                message=message, before=before)
            if written is not None:
                # In this transaction: a committed move always has its hooks' writes (closed
                # questions and waits, queued webhook deliveries) committed with it.
                for hook in transition_hooks_for(to, has_owner=written[0].owner_id is not None):
                    if not hook.before:
                        hook.fn(job=written[0], to=to, actor=actor, channel=channel)
                if to in Job.TERMINAL and written[0].parent_id is not None:
                    from jobs.services.family import parent_child_ended  # the family module builds on this one

                    parent_child_ended(child=written[0])
        if written is None:
            # Refused once the transaction has ended: it wrote nothing, and ends as a commit of
            # nothing rather than a rollback, which would make psycopg drop every statement the
            # connection had prepared (`dbkit.prepared`; a run whose job was cancelled meanwhile
            # refuses its outcome as a matter of course).
            _refuse(job_id, to)
    job = written[0]
    if dispatch:
        # After the move's commit (or with the caller's): `job_dispatch` is looked up when called,
        # the one seam tests replace to keep a job unsent.
        transaction.on_commit(lambda: job_dispatch(job=job, countdown=countdown), robust=True)
    return job


def _move_closing_first(rows: MoveRows, closing, *, job_id: Any, to: str, fields: dict[str, Any],
                        message: dict | None, actor: Any, channel: str | None, before: EarlierEvent | None):
    """The move of a job that holds feature rows: lock its row and check the move, let the
    closing hooks close what the job held (their events come before the status event, which
    stays the last of a finished job), then write the move. None: no job matched."""
    with transaction.atomic():
        locked = rows.queryset().select_for_update().first()
        if locked is None:
            return None  # refused by the caller, after its transaction (nothing was written)
        for hook in closing:
            if locked.owner_id is not None or not hook.owners_only:
                hook.fn(job=locked, to=to, actor=actor, channel=channel)
        written = job_update_with_event(rows=rows, fields=fields, type="status", status=to, message=message,
                                        before=before)
        if written is None:  # not under the row's lock; were it ever so, the hooks' writes roll back with it
            _refuse(job_id, to)
        return written


def _refuse(job_id: Any, to: str) -> NoReturn:
    current = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
    if current is None:
        raise JobNotFound(f"job {job_id} does not exist")
    raise InvalidTransition(f"job {job_id} is {current}; it cannot move to {to}")


def _transition_transaction(*, alone: bool) -> AbstractContextManager:
    """The transaction of one move. A move that writes nothing else (`alone`: no transition hook
    runs after it, e.g. a job without an owner whose webhooks would be told, and it holds nothing
    for a closing hook to close) is ONE statement on PostgreSQL, the UPDATE and its event's
    INSERT as a CTE: `one_statement_write` (no BEGIN and COMMIT outside a transaction, as for
    every claim and the outcome of an ownerless job; no savepoint inside one, as for the resume
    of an answered question). A move that must close feature rows first opens its own."""
    if alone:
        return one_statement_write()
    return transaction.atomic()


_batch = threading.local()


def jobs_dispatch_after_commit(jobs: list[Job]) -> None:
    """Send the messages of `jobs` (just created in the current transaction) once it commits, as
    one batch (`dispatch_batch`). They are marked as on their way now (`dispatch_premark`): the
    reconciler leaves them alone while the batch goes out, and sends again any whose message
    did not once the early marks expire."""
    if not jobs:
        return
    dispatch_premark([job.pk for job in jobs])
    transaction.on_commit(partial(jobs_dispatch, list(jobs)), robust=True)


def jobs_dispatch(jobs: list[Job]) -> None:
    """Send committed, early-marked jobs' messages in one batch. A job whose message cannot be
    built or sent is logged and the rest go on; a batch that does not reach Redis is logged
    whole: the reconciler sends each of its jobs again once its early mark expires."""
    try:
        with dispatch_batch():
            for job in jobs:
                try:
                    job_dispatch(job=job)
                except Exception:
                    logger.exception("job %s: its message could not be sent (the reconciler will)", job.pk)
    except Exception:
        logger.exception("a batch of %d jobs: their messages may not have reached the broker (the reconciler "
                         "sends each again once its early mark expires)", len(jobs))


@contextmanager
def dispatch_batch() -> Iterator[None]:
    """Inside, `job_dispatch` renders each message from its template (`run_message_render`)
    and they are pushed together at the end, in one round trip; a message Celery must send
    itself goes through one Celery producer, taken from the pool once, into kombu's publish
    batch (one pipeline per thousand). Their dispatch marks are held (`dispatch_marks_together`)
    and written after the batch, in one pipeline too, and only once it went out: a batch that
    fails (the exception propagates) leaves its jobs' early marks (`dispatch_premark`, a
    precondition) to expire, and the reconciler sends them again. A message of a failed batch
    that did reach Redis then runs once: the claim refuses the second delivery."""
    # The stack (the batch's flush) exits first, inside the held marks: a flush that fails
    # reaches `dispatch_marks_together`, which then writes none.
    with dispatch_marks_together(), ExitStack() as stack:
        try:
            producer = stack.enter_context(_pooled_producer())
            stack.enter_context(producer.batch())
        except Exception as exc:  # each message then takes its own, and fails on its own
            logger.warning("no producer for a batch of dispatches: %s: %s", type(exc).__name__, exc)
            stack.close()
            producer = None
        from jobs.tasks import job_run  # the tasks module imports the services: bind late

        _batch.producer, _batch.rendered, _batch.direct = producer, [], direct_allowed(job_run)
        try:
            yield
            if _batch.rendered:  # inside the held marks: a push that fails writes none
                run_messages_push(job_run, _batch.rendered)
        finally:
            _batch.producer = _batch.rendered = _batch.direct = None


def _pooled_producer() -> AbstractContextManager:
    from jobs.tasks import job_run  # the tasks module imports the services: bind late

    return job_run.app.producer_or_acquire()


def job_dispatch(*, job: Job, countdown: float | None = None) -> None:
    """Send the Celery message that runs `job` (call it after the job's row is committed), and
    mark it as on its way in the broker (`jobs.broker`).

    The task shows in Flower under the job's kind (Celery's `shadow` name) with the job id as
    its argument.
    """
    from jobs.tasks import job_run  # the tasks module imports the services: bind late

    options: dict[str, Any] = {"shadow": job.kind}
    try:
        job_kind = kind_get(job.kind)
    except UnknownKind:  # it still runs, and fails with a clear error there
        job_kind = None
    if job_kind is not None and job_kind.queue:
        options["queue"] = job_kind.queue
    if job_kind is not None and job_kind.time_limit:
        # Celery raises SoftTimeLimitExceeded in the handler (the runner records `timeout`);
        # the hard limit a minute later kills a run that swallowed it.
        options["soft_time_limit"] = job_kind.time_limit
        options["time_limit"] = job_kind.time_limit + 60
    if countdown:
        options["countdown"] = countdown
    rendered = getattr(_batch, "rendered", None)
    marked = False
    try:
        if rendered is not None:  # in a batch: pushed with the batch's others, at its end
            message = run_message_render(job_run, str(job.pk), options, allowed=_batch.direct)
            if message is not None:
                rendered.append(message)
            sent = message is not None
        else:
            # Its dispatch mark in the message's round trip, unless a batch holds the marks back.
            mark = not dispatch_marks_held()
            sent = run_message_send(job_run, str(job.pk), options, mark=mark)
            marked = sent and mark
    except redis.ConnectionError as exc:  # Celery's publish retries, and reconnects (a second copy runs once)
        logger.warning("job %s: its message went through Celery after %s: %s", job.pk, type(exc).__name__, exc)
        sent = False
    if not sent:
        producer = getattr(_batch, "producer", None)
        if producer is not None:
            options["producer"] = producer
        job_run.apply_async(args=[str(job.pk)], **options)
    if not marked:
        dispatch_mark(job.pk, countdown=countdown)  # on its way: the reconciler will not send it again

