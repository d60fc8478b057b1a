"""Two schedulers, the active one killed with -9: the periodic passes go on within one interval
plus the lease, and no pass ever runs twice at once, as the passes' own log lines show.

Two `celery beat` (LeaderScheduler) and two platform workers run against the test database and
Redis with a lease of 3 s renewed every second and every pass due every second. Both workers log
at debug level, where each run of a pass writes `pass NAME began at T` once it holds its lock and
`pass NAME ended at T` before it lets go; duplicate messages of a slow pass make runs meet at the
lock. The log of every pass, both workers merged, must alternate began / ended.
"""

from __future__ import annotations

import re
import time

import pytest
from django.conf import settings

from ops.models import PeriodicPass
from ops.scheduler import scheduler_seen
from taskplatform.celery import app
from tests.support.processes import celery_beat, celery_worker, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.worker]

LEASE, HEARTBEAT, INTERVAL = 3.0, 1.0, 1.0
# What a pass may need beyond interval + lease after the kill: the new leader's first send reaching
# a worker and the worker starting it, on a busy two-core machine.
PICKUP = 2.0
ENV = {
    "SCHEDULER_LEASE_SECONDS": str(LEASE),
    "SCHEDULER_HEARTBEAT_INTERVAL": str(HEARTBEAT),
    "WAITS_DUE_INTERVAL": str(INTERVAL),
    "JOBS_RECONCILE_INTERVAL": str(INTERVAL),
    "APPROVALS_DEADLINE_INTERVAL": str(INTERVAL),
    "WEBHOOK_SWEEP_INTERVAL": str(INTERVAL),
    "BEAT_SEND_LOG": "true",  # beat's `Sending due task` lines are read below
}
PASS_LINE = re.compile(r"pass (?P<name>\S+) (?P<what>began|ended) at (?P<at>\d+\.\d+)")


def pass_log(*workers) -> dict[str, list[tuple[float, str]]]:
    """Every `began` / `ended` line of the workers, by pass, in time order."""
    events: dict[str, list[tuple[float, str]]] = {}
    for worker in workers:
        for line in list(worker.lines):
            if match := PASS_LINE.search(line):
                events.setdefault(match["name"], []).append((float(match["at"]), match["what"]))
    return {name: sorted(seen, key=lambda event: (event[0], event[1] == "began")) for name, seen in events.items()}


def first_began_after(events: list[tuple[float, str]], moment: float) -> float | None:
    return next((at for at, what in events if what == "began" and at > moment), None)


def test_the_passes_go_on_when_the_active_scheduler_is_killed_and_never_run_twice_at_once(only_own_workers):
    processes = []
    try:
        workers = [
            celery_worker(name=f"platform-{n}", queues=settings.JOBS_PLATFORM_QUEUE, concurrency=2, env=ENV,
                          extra_args=["--loglevel", "DEBUG"]).start()
            for n in (1, 2)
        ]
        processes += workers
        beats = {}
        for name in ("beat-a", "beat-b"):
            beat = celery_beat(name=name, env=ENV).start()
            processes.append(beat)
            beats[beat.proc.pid] = beat

        def leader():
            seen = scheduler_seen()
            if not seen.beating or seen.passes[0].runs == 0:
                return None
            pid = int(seen.holder.split(" pid ")[1].split()[0])
            return beats.get(pid)

        active = wait_until(leader, timeout=60, message="no scheduler took the lease and ran the passes")
        [standby] = [beat for beat in beats.values() if beat is not active]
        wait_until(lambda: sum(PeriodicPass.objects.filter(name="waits.due").values_list("runs", flat=True)) >= 3,
                   timeout=30, message="waits.due does not run every second")
        standby.wait_for_output("stands by", timeout=10)
        assert not [line for line in standby.lines if "Sending due task" in line], "the standby sent passes"

        killed_at = time.time()
        active.kill()  # kill -9, the whole process group
        passes = sorted({entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()})

        def all_passes_went_on() -> bool:
            log = pass_log(*workers)
            return all(first_began_after(log.get(name, []), killed_at) for name in passes)

        # Bounded wait; the figures are asserted below, from the log.
        wait_until(all_passes_went_on, timeout=INTERVAL + LEASE + PICKUP + 10,
                   message=f"the passes did not go on after the kill:\n{standby.output[-3000:]}")
        standby.wait_for_output("leads (epoch", timeout=1)
        log = pass_log(*workers)
        delays = {name: first_began_after(log[name], killed_at) - killed_at for name in passes}
        print("first run after the kill -9 of the active scheduler:",
              ", ".join(f"{name} {delay:.2f} s" for name, delay in delays.items()))
        for name, delay in delays.items():
            assert delay <= INTERVAL + LEASE + PICKUP, f"{name} went on {delay:.2f} s after the kill"
        seen = scheduler_seen()
        assert seen.beating and str(standby.proc.pid) in seen.holder and seen.epoch == 2

        # Duplicates meet at the lock: eight messages of a 0.3 s pass on four slots at once.
        for _ in range(8):
            app.send_task("testkinds.slow_pass", args=[0.3], queue=settings.JOBS_PLATFORM_QUEUE)
        wait_until(
            lambda: (record := PeriodicPass.objects.filter(name="testkinds.slow_pass").first())
            and record.runs + record.skipped == 8,
            timeout=30, message="the slow pass's messages were not all taken",
        )
        record = PeriodicPass.objects.get(name="testkinds.slow_pass")
        assert record.skipped >= 1 and record.runs >= 1, (record.runs, record.skipped)
    finally:
        for process in processes:
            process.stop(timeout=15)

    # Every pass's own log, both workers merged: began, ended, began, ended, … never two began in a row.
    log = pass_log(*workers)
    assert set(passes) | {"testkinds.slow_pass"} <= set(log)
    for name, events in log.items():
        kinds = [what for _, what in events]
        overlaps = [events[i] for i in range(1, len(kinds)) if kinds[i] == kinds[i - 1]]
        assert kinds[0] == "began" and not overlaps, f"{name} ran twice at once around {overlaps[:3]}"
        print(f"{name}: {kinds.count('began')} runs, none at once")
    assert sum(line.count("skipped: another run of it is in progress") for w in workers for line in w.lines) >= 1
