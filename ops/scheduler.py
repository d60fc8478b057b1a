"""The scheduler of the periodic passes: several `celery beat` processes may run, exactly one
sends, and everyone can see whether it does.

**Who sends.** `LeaderScheduler` (settings.CELERY_BEAT_SCHEDULER) is Celery beat's in-memory
scheduler with a lease in the database (`SchedulerLease`): before sending anything a beat claims
or renews the lease with one conditional UPDATE, timed by the database's clock (`Now()`), so
hosts whose clocks disagree still agree on who holds it. The leader renews it every
SCHEDULER_HEARTBEAT_INTERVAL seconds for SCHEDULER_LEASE_SECONDS; a standby asks again when the
lease it saw runs out and takes over the moment it has expired: after a leader's kill -9, at
most one lease later. A leader that cannot renew (its database is away, its process was
paused) stops sending when the lease it last got runs out by its own monotonic clock, measured
from before it asked, so it stops before anyone else may start. A beat stopped cleanly hands
the lease back at once. Why a lease row and not a PostgreSQL advisory lock or celery-redbeat:
README, "Scaling out".

**Each pass alone.** Whatever reaches the workers, each run of a pass holds that pass's lock
(`jobs.periodic`), so two runs of one pass never act at once.

**Seen.** The lease's `renewed_at` is the scheduler's heartbeat; each run of a pass records
itself in `PeriodicPass` (`periodic_pass_record`, a `jobs.extensions.pass_observer`). /readyz,
/metrics and the dashboard read both through `scheduler_seen()`.

Nothing is written to a file: no schedule file (the intervals are seconds, so a restarted beat
loses nothing by starting its clocks again), so no folder has to exist.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import beat, current_task
from celery.schedules import schedule as interval_schedule
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Now

from jobs.clock import database_now
from jobs.extensions import PassEvent

logger = logging.getLogger(__name__)

LEASE_NAME = "beat"
# A leader stops sending this long before the lease it last got runs out (clock rates differ
# a little between hosts, and a send takes a moment).
LEASE_SAFETY = 0.5
# A standby that saw the lease expire asks again this long after.
TAKEOVER_SLACK = 0.05
# Beat's "silent" threshold, in heartbeats, and a pass's, in its intervals (plus one lease, for
# a takeover).
SILENT_AFTER_INTERVALS = 3
# A long leader name is cut to the column's size.
HOLDER_MAX = 255


# -- the lease ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeaseClaim:
    """Who holds the lease after a claim, since when (`epoch` counts the changes of hands), and
    how long it has left (seconds, by the database's clock; negative: expired)."""

    holder: str
    epoch: int
    remaining: float


def scheduler_lease_claim(*, holder: str, lease: float) -> LeaseClaim:
    """Take the lease for `holder` when it holds it already or it has expired, for `lease`
    seconds from now (the database's now); either way, say who holds it. Two statements in one
    transaction: the conditional UPDATE decides, the SELECT reports."""
    from ops.models import SchedulerLease

    mine = Q(holder=holder)
    with transaction.atomic():
        # The row exists once; it starts expired (1970), so the first claim takes it.
        if not SchedulerLease.objects.filter(name=LEASE_NAME).exists():
            SchedulerLease.objects.bulk_create(
                [SchedulerLease(name=LEASE_NAME, expires_at=datetime(1970, 1, 1, tzinfo=UTC))],
                ignore_conflicts=True,
            )
        SchedulerLease.objects.filter(name=LEASE_NAME).filter(mine | Q(expires_at__lt=Now())).update(
            # Every right-hand side reads the row as it was: a renewal keeps its epoch and start.
            epoch=Case(When(mine, then=F("epoch")), default=F("epoch") + 1),
            acquired_at=Case(When(mine, then=F("acquired_at")), default=Now()),
            holder=holder,
            renewed_at=Now(),
            expires_at=ExpressionWrapper(Now() + Value(timedelta(seconds=lease)), output_field=DateTimeField()),
        )
        row = SchedulerLease.objects.get(name=LEASE_NAME)
        now = database_now()
    return LeaseClaim(holder=row.holder, epoch=row.epoch, remaining=(row.expires_at - now).total_seconds())


def scheduler_lease_release(*, holder: str) -> bool:
    """Let the lease expire now if `holder` holds it (a clean stop), so a standby takes over at
    once. True if it held it."""
    from ops.models import SchedulerLease

    return bool(SchedulerLease.objects.filter(name=LEASE_NAME, holder=holder).update(expires_at=Now()))


class LeaderScheduler(beat.Scheduler):
    """Celery beat's scheduler for this platform: sends the periodic passes only while it holds
    the lease (see the module's docstring). Its schedule lives in memory: nothing on disk."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.holder = f"{socket.gethostname()} pid {os.getpid()} {secrets.token_hex(3)}"[:HOLDER_MAX]
        self.lease_seconds = float(settings.SCHEDULER_LEASE_SECONDS)
        self.heartbeat_interval = float(settings.SCHEDULER_HEARTBEAT_INTERVAL)
        self.leading = False
        self._lead_until = 0.0  # monotonic: may send until then
        self._next_claim = 0.0  # monotonic: when to renew, or to ask again
        self._seen_leader: tuple[str, int] | None = None
        self._database_down = False
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One turn of beat's loop: renew or claim the lease when due, then, as the leader, send
        what is due. Returns how long beat may sleep."""
        started = time.monotonic()
        if started >= self._next_claim:
            self._claim(started)
        if self.leading and time.monotonic() >= self._lead_until:
            self._step_down("its lease ran out before it could renew it")
        until_claim = max(self._next_claim - time.monotonic(), 0.0)
        if not self.leading:
            return until_claim
        return min(super().tick(*args, **kwargs), until_claim)

    def adjust(self, n: Any, drift: float = 0.0) -> Any:
        """How long from now an entry's next look is, `n` seconds, as the heap and the sleep take
        it: exactly `n`. Celery's scheduler takes 10 ms off (a `drift` of -0.010): it woke 10 ms
        before each entry was due, found it not due yet, and asked to wake again in the time left
        less the same 10 ms, nothing, so it ticked without sleeping until the entry was due. That
        spin was most of beat's CPU: with the two passes due every second (`waits.due`, the demo's
        callback sweep) some 360 ticks a second and 22 ms of CPU a second doing nothing else, 2.6
        ticks and 1.4 ms without it (bench/README.md, "Beat's spin before each pass"). Woken when
        the entry is due, it sends it at once: a pass is as punctual as before."""
        return n

    def _claim(self, started: float) -> None:
        try:
            close_old_connections()  # beat has no request cycle: drop a broken connection here
            claim = scheduler_lease_claim(holder=self.holder, lease=self.lease_seconds)
        except DatabaseError as exc:
            if not self._database_down:
                logger.warning("scheduler: cannot reach the database to renew the lease: %s", exc)
            self._database_down = True
            connection.close()
            self._next_claim = started + min(1.0, self.heartbeat_interval)
            return
        if self._database_down:
            logger.info("scheduler: the database answers again")
            self._database_down = False
        if claim.holder == self.holder:
            self._lead_until = started + self.lease_seconds - LEASE_SAFETY
            self._next_claim = started + self.heartbeat_interval
            if not self.leading:
                self.leading = True
                self._heap = None  # every pass due now is sent now
                logger.info("scheduler: %s leads (epoch %d): it sends the periodic passes", self.holder, claim.epoch)
            return
        if self.leading:
            self._step_down(f"{claim.holder} holds the lease now")
        if self._seen_leader != (claim.holder, claim.epoch):
            self._seen_leader = (claim.holder, claim.epoch)
            logger.info("scheduler: %s stands by; %s leads (epoch %d, its lease runs %.1f s more)",
                        self.holder, claim.holder, claim.epoch, max(claim.remaining, 0.0))
        # Ask again when the lease it saw runs out (at once if it has), at least every heartbeat.
        self._next_claim = started + min(max(claim.remaining, 0.0) + TAKEOVER_SLACK, self.heartbeat_interval)

    def _step_down(self, why: str) -> None:
        self.leading = False
        self._seen_leader = None
        logger.warning("scheduler: %s stops sending: %s", self.holder, why)

    def close(self) -> None:
        """Beat is stopping: hand the lease back, so a standby takes over at once."""
        try:
            if self.leading and scheduler_lease_release(holder=self.holder):
                logger.info("scheduler: %s handed the lease back", self.holder)
        except DatabaseError as exc:
            logger.warning("scheduler: could not hand the lease back (it expires by itself): %s", exc)
        finally:
            self.leading = False
            super().close()


# -- the passes' runs ----------------------------------------------------------------------------
def _worker_name() -> str:
    hostname = getattr(getattr(current_task, "request", None), "hostname", None)
    return f"{hostname or socket.gethostname()} pid {os.getpid()}"[:HOLDER_MAX]


def periodic_pass_record(event: PassEvent) -> None:
    """Record a run of a periodic pass (a `jobs.extensions.pass_observer`): one UPDATE (an INSERT
    the first time), times by the database's clock. Never raises: a lost record costs a stale
    age on the dashboard, never a pass."""
    from ops.models import PeriodicPass

    if event.what == "ended":
        failed = bool(event.error)
        changes: dict[str, Any] = {
            "runs": F("runs") + 1,
            "last_started_at": ExpressionWrapper(Now() - Value(timedelta(seconds=event.seconds)),
                                                 output_field=DateTimeField()),
            "last_finished_at": Now(),
            "last_duration": event.seconds,
            "last_worker": _worker_name(),
        }
        if failed:
            changes.update(failures=F("failures") + 1, last_error=event.error)
        else:
            changes.update(last_succeeded_at=Now(), last_error="")
    elif event.what == "skipped":
        changes = {"skipped": F("skipped") + 1}
    else:
        return
    try:
        if not PeriodicPass.objects.filter(name=event.name).update(**changes):
            PeriodicPass.objects.get_or_create(name=event.name)
            PeriodicPass.objects.filter(name=event.name).update(**changes)
    except DatabaseError as exc:
        logger.warning("could not record the run of the pass %s: %s", event.name, exc)


# -- what /readyz, /metrics and the dashboard read -------------------------------------------------
def _interval_seconds(entry: dict[str, Any]) -> float | None:
    every = entry.get("schedule")
    if isinstance(every, int | float):
        return float(every)
    if isinstance(every, timedelta):
        return every.total_seconds()
    if isinstance(every, interval_schedule):
        return every.run_every.total_seconds()
    return None  # a crontab or a solar event: no fixed interval to be late by


def scheduled_passes() -> dict[str, float | None]:
    """The task beat sends for each entry of CELERY_BEAT_SCHEDULE, with its interval in seconds."""
    return {entry["task"]: _interval_seconds(entry) for entry in settings.CELERY_BEAT_SCHEDULE.values()}


@dataclass(frozen=True)
class PassSeen:
    """One scheduled pass as last recorded. Ages in seconds by the database's clock (None: never)."""

    name: str
    interval: float | None
    late_after: float | None
    runs: int = 0
    failures: int = 0
    skipped: int = 0
    finished_ago: float | None = None
    succeeded_ago: float | None = None
    duration: float | None = None
    last_error: str = ""
    late: bool = False


@dataclass(frozen=True)
class SchedulerSeen:
    """The scheduler's heartbeat and the passes' last runs, read at one instant of the
    database's clock."""

    silent_after: float
    holder: str = ""
    epoch: int = 0
    heartbeat_ago: float | None = None
    leading_for: float | None = None
    passes: list[PassSeen] = field(default_factory=list)

    @property
    def beating(self) -> bool:
        return self.heartbeat_ago is not None and self.heartbeat_ago <= self.silent_after

    @property
    def late_passes(self) -> list[PassSeen]:
        return [seen for seen in self.passes if seen.late]

    @property
    def healthy(self) -> bool:
        return self.beating and not self.late_passes


def _ago(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max((now - then).total_seconds(), 0.0)


def scheduler_seen() -> SchedulerSeen:
    """Read the lease and the passes' records (two queries and the clock). A pass is late when it
    has not finished without error for SILENT_AFTER_INTERVALS of its intervals plus a lease (a
    takeover's worth); one that never ran is late once a leader has led that long. Raises
    DatabaseError when the database does not answer."""
    from ops.models import PeriodicPass, SchedulerLease

    heartbeat = float(settings.SCHEDULER_HEARTBEAT_INTERVAL)
    lease_seconds = float(settings.SCHEDULER_LEASE_SECONDS)
    silent_after = SILENT_AFTER_INTERVALS * heartbeat
    now = database_now()
    lease = SchedulerLease.objects.filter(name=LEASE_NAME).first()
    records = {record.name: record for record in PeriodicPass.objects.filter(name__in=scheduled_passes())}
    heartbeat_ago = _ago(now, lease.renewed_at) if lease else None
    leading_for = _ago(now, lease.acquired_at) if lease and heartbeat_ago is not None else None
    if heartbeat_ago is not None and heartbeat_ago > silent_after:
        leading_for = None  # nobody leads
    passes = []
    for name, interval in sorted(scheduled_passes().items()):
        late_after = None if interval is None else SILENT_AFTER_INTERVALS * interval + lease_seconds
        record = records.get(name)
        succeeded_ago = _ago(now, record.last_succeeded_at) if record else None
        if late_after is None:
            late = False
        elif succeeded_ago is None:
            late = leading_for is not None and leading_for > late_after
        else:
            late = succeeded_ago > late_after
        passes.append(PassSeen(
            name=name, interval=interval, late_after=late_after, late=late, succeeded_ago=succeeded_ago,
            runs=record.runs if record else 0, failures=record.failures if record else 0,
            skipped=record.skipped if record else 0,
            finished_ago=_ago(now, record.last_finished_at) if record else None,
            duration=record.last_duration if record else None, last_error=record.last_error if record else "",
        ))
    return SchedulerSeen(
        silent_after=silent_after, holder=lease.holder if lease else "", epoch=lease.epoch if lease else 0,
        heartbeat_ago=heartbeat_ago, leading_for=leading_for, passes=passes,
    )


def scheduler_check(seen: SchedulerSeen) -> str:
    """The /readyz line: `ok: …`, or `error: …` naming what is silent and what stops with it."""
    stops = "nothing reconciles jobs, expires deadlines, wakes waits or retries webhooks"
    if seen.heartbeat_ago is None:
        return f"error: no scheduler (celery beat) has ever run against this database: {stops}"
    if not seen.beating:
        return (f"error: the scheduler (celery beat) is silent: its last heartbeat was {seen.heartbeat_ago:.0f} s "
                f"ago (more than {SILENT_AFTER_INTERVALS} × {settings.SCHEDULER_HEARTBEAT_INTERVAL:g} s), "
                f"from {seen.holder}: {stops}")
    if seen.late_passes:
        late = "; ".join(
            f"{p.name} (every {p.interval:g} s, "
            + ("never ran" if p.succeeded_ago is None else f"last ran {p.succeeded_ago:.0f} s ago")
            + (f", last error: {p.last_error}" if p.last_error else "") + ")"
            for p in seen.late_passes
        )
        return (f"error: periodic passes are late: {late}; is a worker consuming "
                f"{settings.JOBS_PLATFORM_QUEUE!r}?")
    return (f"ok: {seen.holder} beat {seen.heartbeat_ago:.1f} s ago (epoch {seen.epoch}); "
            f"{len(seen.passes)} passes on time")
