"""Child jobs: spawning them for a running parent, waking a parent that gathers them, and
carrying a cancel or a retry of a parent down to its descendants.

**Lock order.** The platform locks a job row before anything that belongs to it. Between jobs of
one family, the deeper row goes first: a child that ends locks itself (its own UPDATE), then its
parent; a cancel or retry of a parent locks the unfinished descendants deepest first, then the
parent. So two moves in one family never wait for each other in a circle.

**Exactly one wake.** A parent parked in `ctx.gather` has `gathering` set. A child that ends
locks the parent's row and, if it was the last gathered child to end (or the first to fail under
`fail_fast`), moves the parent `waiting → pending`. The park itself re-checks the children under
the same lock (`gather_park_apply`), so a child that ended while the parent was still parking is
seen by exactly one of the two.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F

from jobs import typed
from jobs.errors import UnknownKind
from jobs.events import event_append, jobs_create_with_first_events
from jobs.models import Job
from jobs.registry import kind_get
from jobs.services import transitions
from jobs.services.submitting import attempt_budget, request_digest
from jobs.services.transitions import job_transition

logger = logging.getLogger(__name__)

Status = Job.Status
UNFINISHED = [Status.PENDING, Status.PROCESSING, Status.PAUSED, Status.WAITING]
RETRYABLE = [Status.FAILED, Status.CANCELLED]
MAX_DEPTH = 32  # how deep a cascade follows a family (a deeper one is a runaway recursion)

FAIL_FAST = "fail_fast"
COLLECT = "collect"
POLICIES = (FAIL_FAST, COLLECT)


class ChildChanged(Exception):  # noqa: N818 (what the author did, reported as a JobFailure)
    """A replay spawned a key again with another kind or input (`child_changed`)."""


def children_spawn(
    *, parent: Job, run_attempt: int, step: str, specs: Sequence[tuple[str, str, dict[str, Any]]]
) -> list[Job]:
    """Make sure the children `specs` (`(spawn key, kind, input)`) exist for `parent`, creating
    the missing ones; return them in the order of `specs`.

    Idempotent: a child already spawned under a key (an earlier run of the parent) is returned,
    not spawned again; the same key with another kind or input raises ChildChanged. The new
    children are created `pending` in one transaction with the parent's `step` event (fenced to
    the run `run_attempt`, so a run that lost its job spawns nothing), owned by the parent's
    owner, and dispatched after the commit. Inputs must already be valid for their kinds.
    """
    keys = [key for key, _, _ in specs]
    if len(set(keys)) != len(keys):
        raise ValueError("child keys must be distinct within one spawn")
    existing = _children_by_key(parent.pk, keys)
    _check_same(existing, specs)
    missing = [spec for spec in specs if spec[0] not in existing]
    if not missing:
        event_append(job_id=parent.pk, type="step", step=step, status="skipped",
                     message={"children": len(specs)}, run_attempt=run_attempt)
        return [existing[key] for key in keys]
    kinds = sorted({kind for _, kind, _ in missing})
    try:
        with transaction.atomic():
            event_append(job_id=parent.pk, type="step", step=step, status="completed",
                         message={"spawned": len(missing), "children": len(specs), "kind": ", ".join(kinds)},
                         run_attempt=run_attempt)
            budgets = {kind: attempt_budget(kind) for kind in kinds}
            created = jobs_create_with_first_events(
                shared={"owner_id": parent.owner_id, "idempotency_key": None, "parent_id": parent.pk},
                each=("kind", "input", "max_attempts", "spawn_key"),
                rows=[(kind, value, budgets[kind], key) for key, kind, value in missing])
            transitions.jobs_dispatch_after_commit(created)
    except IntegrityError:
        # Another delivery of the same run spawned them first (the unique key per parent).
        existing = _children_by_key(parent.pk, keys)
        _check_same(existing, specs)
        if len(existing) != len(keys):
            raise
        return [existing[key] for key in keys]
    existing.update({child.spawn_key: child for child in created})
    return [existing[key] for key in keys]


def _children_by_key(parent_id: Any, keys: list[str]) -> dict[str, Job]:
    rows = Job.objects.filter(parent_id=parent_id, spawn_key__in=keys).only("id", "kind", "input", "spawn_key")
    return {child.spawn_key: child for child in rows}


def _check_same(existing: dict[str, Job], specs: Iterable[tuple[str, str, dict[str, Any]]]) -> None:
    for key, kind, value in specs:
        child = existing.get(key)
        if child is not None and request_digest(kind=child.kind, input=child.input) != request_digest(
            kind=kind, input=value
        ):
            raise ChildChanged(
                f"child {key!r} was spawned again with another kind or input (it is {child.kind} {child.pk}); "
                "a replay must spawn exactly what the first run spawned: use a new key for a new child"
            )


def children_state(ids: Sequence[Any]) -> dict[str, Job]:
    """The children `ids` as they are now (status, result, error, when they ended), by id."""
    rows = Job.objects.filter(pk__in=list(ids)).only(
        "id", "kind", "status", "result", "error", "finished_at", "spawn_key", "parent_id"
    )
    return {str(child.pk): child for child in rows}


def gather_due(*, ids: Sequence[str], policy: str) -> bool:
    """Is a gather of `ids` over: every child ended, or (fail_fast) one failed or was cancelled?"""
    rows = Job.objects.filter(pk__in=list(ids))
    if policy == FAIL_FAST and rows.filter(status__in=RETRYABLE).exists():
        return True
    return not rows.filter(status__in=UNFINISHED).exists()


def gather_park_apply(*, job: Job, ids: Sequence[str], policy: str) -> bool:
    """Record what the parent gathers as it parks; True when that is already over (a child ended
    while the run was parking: the parent is then runnable again at once).

    Precondition: called by `jobs.services.job_suspend`, in the transaction that parks `job`,
    holding its row lock.
    """
    Job.objects.filter(pk=job.pk).update(gathering={"ids": [str(i) for i in ids], "policy": policy})
    return gather_due(ids=ids, policy=policy)


def parent_child_ended(*, child: Job) -> None:
    """`child` just ended: wake its parent if it gathers the child and nothing else is left.

    Precondition: in the transaction that moved `child` into a terminal status, after its row
    was written (so the child's row is locked first, then the parent's).
    """
    parent = (
        Job.objects.select_for_update(no_key=True)
        .filter(pk=child.parent_id)
        .values_list("status", "gathering")
        .first()
    )
    if parent is None:
        return
    status, gathering = parent
    if status != Status.WAITING or not gathering or str(child.pk) not in gathering.get("ids", []):
        return
    policy = gathering.get("policy", FAIL_FAST)
    ended = child.status != Status.COMPLETED and policy == FAIL_FAST
    if not ended and not gather_due(ids=gathering["ids"], policy=policy):
        return
    job_transition(
        job_id=child.parent_id, to=Status.PENDING, from_=[Status.WAITING], fields={"run_after": None},
        message={"by": "children", "child": str(child.pk), "child_status": child.status}, dispatch=True,
    )


def descendants_lock(*, job_id: Any, statuses: Sequence[str]) -> list[tuple[Any, str]]:
    """Lock the descendants of `job_id` (children, their children, …) whose status is one of
    `statuses`, deepest first; return `(id, status)` in that order.

    Precondition: the caller holds a transaction and locks `job_id` itself only afterwards (the
    family's lock order: deeper rows first). On SQLite, which locks the whole database for a
    writer, nothing is locked row by row.
    """
    return _trees_lock(roots=[job_id], statuses=statuses, include_roots=False)


def _trees_lock(*, roots: Sequence[Any], statuses: Sequence[str], include_roots: bool) -> list[tuple[Any, str]]:
    connection = connections[Job.objects.db]
    table = connection.ops.quote_name(Job._meta.db_table)
    pk_field = Job._meta.pk
    ids = [pk_field.get_db_prep_value(pk_field.to_python(root), connection) for root in roots]
    if not ids:
        return []
    root_marks = ", ".join(["%s"] * len(ids))
    status_marks = ", ".join(["%s"] * len(statuses))
    base = f"id IN ({root_marks})" if include_roots else f"parent_id IN ({root_marks})"
    lock = " FOR NO KEY UPDATE OF j" if connection.vendor == "postgresql" else ""
    sql = (
        f"WITH RECURSIVE tree(id, depth) AS ("
        f" SELECT id, 1 FROM {table} WHERE {base}"
        f" UNION ALL SELECT c.id, t.depth + 1 FROM {table} c JOIN tree t ON c.parent_id = t.id WHERE t.depth < %s)"
        f" SELECT j.id, j.status FROM {table} j JOIN tree t ON j.id = t.id"
        f" WHERE j.status IN ({status_marks}) ORDER BY t.depth DESC, j.id{lock}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*ids, MAX_DEPTH, *statuses])
        rows = cursor.fetchall()
    return [(pk_field.to_python(row_id), status) for row_id, status in rows]


def children_cancel(*, ids: Sequence[Any], reason: str) -> int:
    """Cancel the unfinished jobs `ids` (children of one parent) and their unfinished
    descendants, `reason` in their events. Returns how many were cancelled.

    Precondition: the caller holds a transaction and has not locked their parent yet (the parent
    of a `fail_fast` gather calls this from its failure's `record`, before its own move).
    """
    rows = _trees_lock(roots=ids, statuses=UNFINISHED, include_roots=True)
    return descendants_cancel(rows=rows, reason=reason)


def descendants_cancel(
    *, rows: list[tuple[Any, str]], actor: Any = None, channel: str | None = None, reason: str = "parent cancelled"
) -> int:
    """Cancel the unfinished descendants `rows` (from `descendants_lock`) of a job that is being
    cancelled, each with its questions and waits closed by the transition hooks. Returns how many.

    Precondition: the caller holds the transaction, and locked the rows before their ancestor."""
    for child_id, _ in rows:
        job_transition(job_id=child_id, to=Status.CANCELLED, from_=UNFINISHED,
                       message={"by": getattr(actor, "username", None), "cascade": reason},
                       actor=actor, channel=channel)
    return len(rows)


def descendants_retry(*, rows: list[tuple[Any, str]], actor: Any = None) -> int:
    """Retry the failed and cancelled descendants `rows` (from `descendants_lock`) of a parent
    that is being retried, so that its new run finds them running again. Returns how many."""
    for child_id, _ in rows:
        kind = Job.objects.filter(pk=child_id).values_list("kind", flat=True).first()
        job_transition(
            job_id=child_id, to=Status.PENDING, from_=RETRYABLE,
            fields={"max_attempts": F("attempts") + attempt_budget(kind), "error": None, "result": None,
                    "run_after": None},
            message={"by": getattr(actor, "username", None), "retry": True, "parent": True},
            dispatch=True,
        )
    return len(rows)


def kind_result(kind: str, result: Any) -> Any:
    """A child's stored result as its kind's result model (as is for an untyped or unknown kind)."""
    try:
        return kind_get(kind).result_value(result)
    except (UnknownKind, typed.ValidationError):  # a kind gone, or a result stored before its model changed
        logger.warning("the result of a %s child does not fit its kind's result model; kept as JSON", kind)
        return result
