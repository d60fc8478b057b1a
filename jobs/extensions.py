"""How the feature apps plug into the core, explicitly: the registry they fill in their
`AppConfig.ready()`. The core imports no feature app (an import-linter contract checks it);
it learns about questions, waits, webhooks and the rest only through what is registered here.

- **`ctx` methods** (`context_method`): `ctx.ask` and `ctx.question` come from `approvals`,
  `ctx.wait_for` from `waits`. Job authors see no difference.
- **Transition hooks** (`transition_hook`): functions run inside the transaction of a status
  move into the statuses they name, after the job's row is locked (so the job row is always the
  first lock taken): after the row is written, or with `before=True` just before, so that what
  they record comes before the move's `status` event in the job's log (a finished job's last
  event is its status event). A finished job's questions and waits close this way (before:
  closing hooks, run only for a job marked as holding such rows, `Job.feature_rows`, which the
  feature sets under the job's lock when it writes them), and a status change queues the
  owner's webhooks (after).
- **Visibility** (`visibility_rule`): extra reasons a user may see a job (a reviewer sees the
  jobs whose questions they may answer).
- **Job page and admin sections** (`job_section`, `job_admin_inline`, `job_admin_link`): what a
  feature shows on a job's page and admin page.
- **Periodic passes** (`pass_observer`): told after each run of a pass beat sends (`ops` records
  them for /readyz, /metrics and the dashboard).
- **Runs** (`run_observer`): told as each run of a job's task begins and ends, in the process
  that runs it (`ops` names the job on the log lines of its run, and records for /readyz that
  the worker took a job).
- **Test harness drivers** (`harness_driver`): how `jobs.testing` plays a feature's suspension
  in-process, as the platform would (answer a question, deliver a wait's result, let a deadline
  pass on the test clock), and the test doubles a run needs (a fake outside service).

Like Django's own contrib apps (`django.contrib.admin` knows no app; each app registers with
it), registration is explicit and happens once, at start-up. Registering the same name twice
replaces the earlier entry (a test settings module may reload an app), so a process never runs
a hook twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, ValuesView
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from django.utils.module_loading import import_string

__all__ = [
    "HarnessDriver",
    "PassEvent",
    "RunStart",
    "TransitionHook",
    "context_method",
    "context_method_names",
    "harness_driver",
    "harness_drivers",
    "job_admin_inline",
    "job_admin_inlines",
    "job_admin_link",
    "job_admin_links",
    "job_section",
    "job_sections",
    "pass_observer",
    "pass_observers",
    "run_observer",
    "run_observers",
    "transition_hook",
    "transition_hooks_for",
    "visibility_rule",
    "visibility_rules",
]


# -- ctx methods -------------------------------------------------------------------------------
def context_method(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make the decorated function a method of `jobs.runtime.JobContext` named `name`.

    The function takes the context as its first argument, like any method. A name the core
    itself defines (`step`, `progress`, `log`, …) cannot be replaced.
    """

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        from jobs.runtime import JobContext  # the runtime imports this module: bind late

        existing = JobContext.__dict__.get(name)
        if existing is not None and not getattr(existing, "_registered_context_method", False):
            raise ValueError(f"ctx.{name} is part of the core runtime and cannot be replaced by an extension")
        fn._registered_context_method = True  # type: ignore[attr-defined]
        setattr(JobContext, name, fn)
        _context_methods[name] = fn
        return fn

    return register


_context_methods: dict[str, Callable[..., Any]] = {}


def context_method_names() -> list[str]:
    """The names of the `ctx` methods the apps registered (`ask`, `wait_for`, `spawn`, …)."""
    return sorted(_context_methods)


# -- transition hooks --------------------------------------------------------------------------
@dataclass(frozen=True)
class TransitionHook:
    """A function run in the transaction of every move into one of `statuses`.

    `fn(*, job, to, actor, channel)` gets the updated job row (with `before`, the row as it is
    before the move, locked; the move is sure to happen once the hook returns; such a hook closes
    the feature's rows and runs only for a job with `feature_rows` set); `actor` and
    `channel` are who asked for the move and through what (admin, api, web, system), when the
    move says so. With `owners_only`, jobs without an owner skip it (and a move that runs no
    hook at all can be one autocommit statement: see `jobs.services.transition`).

    `needed_when` (for a hook run after the move) gives a condition on the job's row, a boolean
    expression such as `Exists(…)` over `OuterRef` columns, outside which the hook has nothing to
    do (the owner's webhooks: the owner has an active one). A move whose after-hooks all have
    one is first tried as that one statement, fenced to the rows where none of them holds; only
    when it matches nothing (a hook is needed, or the move is refused) does the move take its
    transaction and run the hooks. The condition is read in the move's own statement, so a hook
    is never skipped for a row it was needed for at that moment.
    """

    name: str
    statuses: frozenset[str]
    fn: Callable[..., None]
    owners_only: bool = False
    before: bool = False
    needed_when: Callable[[], Any] | None = None


_transition_hooks: dict[str, TransitionHook] = {}
# (status, has_owner) → the hooks of such a move (`transition_hooks_for`); emptied at a registration.
_hooks_for: dict[tuple[str, bool | None], tuple[TransitionHook, ...]] = {}


def transition_hook(
    name: str,
    *,
    statuses: Iterable[str],
    owners_only: bool = False,
    before: bool = False,
    needed_when: Callable[[], Any] | None = None,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Run the decorated function inside every move of a job into one of `statuses` (after the
    job's row is written, or with `before` just before it; only where `needed_when()` holds,
    when given: see `TransitionHook`)."""
    if before and needed_when is not None:
        raise ValueError("needed_when is for hooks run after the move (a closing hook has `feature_rows`)")

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        _transition_hooks[name] = TransitionHook(name=name, statuses=frozenset(statuses), fn=fn,
                                                 owners_only=owners_only, before=before, needed_when=needed_when)
        _hooks_for.clear()
        return fn

    return register


def transition_hooks_for(to: str, *, has_owner: bool | None) -> tuple[TransitionHook, ...]:
    """The hooks a move into `to` runs. `has_owner=None` (not known yet) counts every
    owners-only hook as possibly running. Worked out once for each (every move asks, twice)."""
    key = (to, has_owner)
    found = _hooks_for.get(key)
    if found is None:
        found = _hooks_for[key] = tuple(
            hook for hook in _transition_hooks.values()
            if to in hook.statuses and (has_owner is not False or not hook.owners_only)
        )
    return found


# -- visibility --------------------------------------------------------------------------------
_visibility_rules: dict[str, Callable[..., Any]] = {}


def visibility_rule(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`fn(user, per_row=…)` returns a `Q` (or boolean expression such as `Exists(...)`) over
    `Job`: the further jobs an active, signed-in, non-staff `user` may see besides their own.
    With `per_row` true the caller reads one job or a few, and the condition must be checked on
    each job's own rows (`accounts.assignment`), never through a set built over every row."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _visibility_rules[name] = fn
        return fn

    return register


def visibility_rules() -> list[Callable[..., Any]]:
    return list(_visibility_rules.values())


# -- pages and admin ---------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSection:
    """A part of a job's page (`jobs/_panel.html`): `context(request, job, next_url, posted)`
    returns the template's context, or None to show nothing. `posted` holds what a feature's
    own view passes back (a form with errors) when it renders the page again."""

    name: str
    template: str
    context: Callable[..., dict[str, Any] | None]
    order: int = 100


_job_sections: dict[str, JobSection] = {}


def job_section(name: str, *, template: str, order: int = 100) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Show the decorated context function's section on every job's page."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _job_sections[name] = JobSection(name=name, template=template, context=fn, order=order)
        return fn

    return register


def job_sections() -> list[JobSection]:
    return sorted(_job_sections.values(), key=lambda section: (section.order, section.name))


_job_admin_inlines: dict[str, tuple[int, type]] = {}


def job_admin_inline(inline: type, *, order: int = 100) -> type:
    """Show an admin inline (of a model with a `job` foreign key) on the job's admin page."""
    _job_admin_inlines[f"{inline.__module__}.{inline.__qualname__}"] = (order, inline)
    return inline


def job_admin_inlines() -> list[type]:
    return [inline for _, inline in sorted(_job_admin_inlines.values(), key=lambda item: item[0])]


_job_admin_links: dict[str, Callable[[Any], str]] = {}


def job_admin_link(name: str) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    """`fn(job)` returns HTML (escaped with `format_html`) shown under "links" on the job's admin
    page, or "" for none."""

    def register(fn: Callable[[Any], str]) -> Callable[[Any], str]:
        _job_admin_links[name] = fn
        return fn

    return register


def job_admin_links() -> list[Callable[[Any], str]]:
    return list(_job_admin_links.values())


# -- periodic passes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PassEvent:
    """What happened to one run of a periodic pass (`jobs.periodic`): `what` is `ended` (it ran;
    `seconds` long, `error` set when it raised) or `skipped` (another run of the same pass held
    its lock, so this one did nothing)."""

    name: str
    what: str
    seconds: float = 0.0
    error: str = ""


_pass_observers: dict[str, Callable[[PassEvent], None]] = {}


def pass_observer(name: str) -> Callable[[Callable[[PassEvent], None]], Callable[[PassEvent], None]]:
    """Call the decorated function with a `PassEvent` after each run of a periodic pass, in the
    worker that ran it, while the pass still holds its lock. It must not raise."""

    def register(fn: Callable[[PassEvent], None]) -> Callable[[PassEvent], None]:
        _pass_observers[name] = fn
        return fn

    return register


def pass_observers() -> list[Callable[[PassEvent], None]]:
    return list(_pass_observers.values())


# -- runs of a job ---------------------------------------------------------------------------
class RunStart(NamedTuple):
    """A run of a job's task (`jobs.run`) begins: for `job_id`, of `kind` as its message names it
    ("" when it does not), on the worker `hostname` ("" when run by its caller); `eager`: run in
    its caller's thread (`apply()`, always-eager)."""

    job_id: str
    kind: str
    hostname: str
    eager: bool


RunEnd = Callable[[], None]
_run_observers: dict[str, Callable[[RunStart], RunEnd | None]] = {}


def run_observer(name: str) -> Callable[[Callable[[RunStart], RunEnd | None]], Callable[[RunStart], RunEnd | None]]:
    """Call the decorated function with a `RunStart` as each run of a job's task begins, in the
    process that runs it, before the claim; what it returns, when not None, is called as the run
    ends, after Celery's own log lines about it (the observers' ends in the reverse order; a run
    whose message Celery retries or ignores ends as the next run in that process begins: see
    `jobs.tasks.JobRunTask`). Neither may raise."""

    def register(fn: Callable[[RunStart], RunEnd | None]) -> Callable[[RunStart], RunEnd | None]:
        _run_observers[name] = fn
        return fn

    return register


def run_observers() -> ValuesView[Callable[[RunStart], RunEnd | None]]:
    """The registered observers, as a view (every run asks: nothing is copied)."""
    return _run_observers.values()


# -- test harness drivers ----------------------------------------------------------------------
@dataclass(frozen=True)
class HarnessDriver:
    """How `jobs.testing.run_kind` plays one feature's suspension in-process, without Celery.

    `resume(job, run)` is called for a job of the run that is suspended in `status` (`paused`
    or `waiting`) while nothing else can run: it does what the outside world would (a person
    answers the question, the service calls back, the clock passes a deadline or a backup mark
    and beat's pass runs) and returns True when it did something, False when this driver has
    nothing to do for the job. It may raise `jobs.testing.HarnessError` when the test gave it no
    way on (no answer for a question without a deadline).

    `prepare(ctx, run)`, when given, is called on each run's context before the handler runs:
    it installs the test doubles the feature needs (a fake outside service for `ctx.wait_for`).
    `run` is the `jobs.testing.KindRun` (its `answers`, `wait_results`, `clock`).

    Both are registered by their dotted paths and imported when a test's harness first asks for
    them: a feature's harness module imports `jobs.testing` (and its test doubles, `unittest.mock`
    among them), which no process that serves jobs needs to load.
    """

    name: str
    status: str
    resume_path: str
    prepare_path: str | None = None

    @cached_property
    def resume(self) -> Callable[[Any, Any], bool]:
        return import_string(self.resume_path)

    @cached_property
    def prepare(self) -> Callable[[Any, Any], None] | None:
        return import_string(self.prepare_path) if self.prepare_path else None


_harness_drivers: dict[str, HarnessDriver] = {}


def harness_driver(name: str, *, status: str, resume: str, prepare: str | None = None) -> None:
    """Register the harness driver `name` for jobs suspended in `status`: `resume` and `prepare`
    are the dotted paths of its functions (see `HarnessDriver`)."""
    _harness_drivers[name] = HarnessDriver(name=name, status=status, resume_path=resume, prepare_path=prepare)


def harness_drivers() -> list[HarnessDriver]:
    return [_harness_drivers[name] for name in sorted(_harness_drivers)]
