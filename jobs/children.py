"""Child jobs, as job code uses them: `ctx.spawn`, `ctx.map` and `ctx.gather`.

    reviews = ctx.map("demo.review", [ReviewInput(document=d) for d in input.documents], key="review")
    results = ctx.gather(reviews)                 # parks the job, holding no worker, until all ended
    summary = ctx.spawn("docs.summary", {"ids": ids}, key="summary")

A child is a job of its own (its own worker, retries, questions and waits), owned by the
parent's owner, with `parent` set. It is spawned **once**: the key names it within the parent,
and a replay of the parent (after an answer, a crash, a retry) finds it instead of spawning it
again; a replay that spawns a key with another kind or input fails the parent with
`child_changed`. `ctx.gather` parks the parent as `waiting` until every child it names has ended,
then returns their results (the child kind's result model when it declares one):

- `policy="fail_fast"` (the default): the first child to fail or be cancelled fails the parent
  at once with `child_failed` (naming the child and its error), and its unfinished siblings in
  the gather are cancelled; otherwise the results, in the order given.
- `policy="collect"`: waits for every child, and returns a `ChildOutcome` for each (`ok`,
  `status`, `result`, `error`), in the order given.

Cancelling a parent cancels its unfinished children; retrying it retries its failed and
cancelled ones. The core registers these methods on `JobContext` (`jobs.apps`), as the feature
apps register theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobs import typed
from jobs.errors import InvalidInput, UnknownKind
from jobs.models import Job
from jobs.registry import kind_get
from jobs.runtime import JobFailure, Suspend
from jobs.services import family

if TYPE_CHECKING:
    from jobs.runtime import JobContext

__all__ = ["COLLECT", "FAIL_FAST", "Child", "ChildOutcome", "gather", "map_children", "spawn"]

FAIL_FAST = family.FAIL_FAST
COLLECT = family.COLLECT


@dataclass(frozen=True)
class Child:
    """A spawned child job: its id, the key it was spawned under, its kind."""

    id: str
    key: str
    kind: str


@dataclass(frozen=True)
class ChildOutcome:
    """How a child ended (`ctx.gather(..., policy="collect")`)."""

    id: str
    key: str
    kind: str
    status: str  # completed, failed or cancelled
    result: Any  # the child kind's result model when it declares one; None unless completed
    error: dict | None

    @property
    def ok(self) -> bool:
        return self.status == Job.Status.COMPLETED


def spawn(ctx: JobContext, kind: str, input: Any = None, *, key: str) -> Child:
    """Submit one child job of `kind` with `input` (a dict or the kind's input model), once.

    `key` names the child within this job and must be stable across runs. Returns a `Child`
    handle for `ctx.gather`. The child starts at once, in another worker; this call does not
    wait for it.
    """
    [child] = _spawn(ctx, key, [(key, kind, input)])
    return child


def map_children(ctx: JobContext, kind: str, inputs: Iterable[Any], *, key: str) -> list[Child]:
    """`ctx.map`: submit one child job of `kind` per input, once; their keys are `key.0`,
    `key.1`, …. All are created in one transaction. Returns their handles in input order."""
    specs = [(f"{key}.{index}", kind, value) for index, value in enumerate(inputs)]
    return _spawn(ctx, key, specs)


def gather(ctx: JobContext, *children: Child | Iterable[Child], policy: str = FAIL_FAST) -> list[Any]:
    """Wait, holding no worker, until every child in `children` (handles, or lists of handles)
    has ended; then return their results in order (`fail_fast`) or their outcomes (`collect`).

    While any is unfinished, the job parks as `waiting` (the run stops here); the last child
    to end makes it runnable again, exactly once, and the handler runs again from the top (the
    spawns before this call find their children). Under `fail_fast` the first child to fail or be
    cancelled ends the job as `failed` with the code `child_failed`.
    """
    if policy not in family.POLICIES:
        raise ValueError(f"gather policy must be one of {', '.join(family.POLICIES)}, not {policy!r}")
    handles = _flatten(children)
    if not handles:
        return []
    ctx.flush()  # a held progress report goes first
    ctx._hand_back_if_asked()
    ids = [handle.id for handle in handles]
    state = family.children_state(ids)
    strangers = [h.key for h in handles if h.id not in state or state[h.id].parent_id != ctx.job_id]
    if strangers:
        raise ValueError(f"ctx.gather takes this job's own children; not: {', '.join(strangers)}")
    if policy == FAIL_FAST:
        ended_badly = [state[h.id] for h in handles if state[h.id].status in family.RETRYABLE]
        if ended_badly:
            raise _child_failed(handles, state, min(ended_badly, key=lambda child: (child.finished_at, str(child.pk))))
    unfinished = [h for h in handles if state[h.id].status not in Job.TERMINAL]
    if unfinished:
        raise Suspend(
            f"waiting for {len(unfinished)} of {len(handles)} child jobs",
            status=Job.Status.WAITING,
            apply=lambda job: family.gather_park_apply(job=job, ids=ids, policy=policy),
            message={"gather": len(handles), "unfinished": len(unfinished), "policy": policy},
        )
    if policy == FAIL_FAST:
        return [family.kind_result(state[h.id].kind, state[h.id].result) for h in handles]
    return [
        ChildOutcome(
            id=h.id, key=h.key, kind=h.kind, status=state[h.id].status, error=state[h.id].error,
            result=family.kind_result(h.kind, state[h.id].result) if state[h.id].status == Job.Status.COMPLETED
            else None,
        )
        for h in handles
    ]


def _spawn(ctx: JobContext, step: str, specs: list[tuple[str, str, Any]]) -> list[Child]:
    ctx.flush()
    ctx._hand_back_if_asked()
    specs_json = [(key, kind, _input_json(key, kind, value)) for key, kind, value in specs]
    try:
        existing = family._children_by_key(ctx.job_id, [key for key, _, _ in specs_json])
        family._check_same(existing, specs_json)
        if len(existing) == len(specs_json):  # a replay: all spawned by an earlier run
            ctx._event("step", step=step, status="skipped", message={"children": len(specs_json)})
            jobs = [existing[key] for key, _, _ in specs_json]
        else:
            jobs = family.children_spawn(parent=ctx.job, run_attempt=ctx.attempt, step=step, specs=specs_json)
    except family.ChildChanged as exc:
        raise JobFailure("child_changed", str(exc)) from None
    return [Child(id=str(job.pk), key=job.spawn_key, kind=job.kind) for job in jobs]


def _input_json(key: str, kind: str, value: Any) -> dict[str, Any]:
    """The child's input as JSON, checked against its kind (an author's mistake fails the parent)."""
    try:
        job_kind = kind_get(kind)
    except UnknownKind as exc:
        raise JobFailure("unknown_kind", f"child {key!r}: {exc.message}") from None
    data = typed.to_json({} if value is None else value, unset=False)
    try:
        job_kind.validate_input(data)
    except InvalidInput as exc:
        raise JobFailure("invalid_child_input", f"child {key!r} ({kind}): {exc.message}") from None
    return data


def _flatten(children: Iterable[Any]) -> list[Child]:
    handles: list[Child] = []
    for item in children:
        if isinstance(item, Child):
            handles.append(item)
        elif isinstance(item, Iterable) and not isinstance(item, (str, bytes, dict)):
            handles.extend(_flatten(item))
        else:
            raise TypeError(f"ctx.gather takes the handles ctx.spawn and ctx.map return, not {item!r}")
    return handles


def _child_failed(handles: list[Child], state: dict[str, Job], first: Job) -> JobFailure:
    handle = next(h for h in handles if h.id == str(first.pk))
    error = first.error or {}
    what = f"{error.get('code')}: {error.get('message', '')}".strip() if error else first.status
    siblings = [h.id for h in handles if state[h.id].status not in Job.TERMINAL]

    def record() -> None:  # in the transaction that fails this job, before its own move
        family.children_cancel(ids=siblings, reason=f"a sibling ({handle.key}) {first.status}")

    return JobFailure(
        "child_failed",
        f"child {handle.key!r} ({handle.kind} {handle.id}) {first.status}: {what}"[:2000],
        record=record if siblings else None,
    )
