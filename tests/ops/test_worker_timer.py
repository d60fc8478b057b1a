"""The worker's timer keeps only what is still to come: each task's time limit, cancelled when the
task ends, is dropped from the heap (`ops.signals.timer_compact`), not kept there for an hour."""

from __future__ import annotations

import heapq
import re
import time
import uuid
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu.asynchronous.timer import Timer

from jobs.models import Job
from jobs.services import job_submit
from jobs.tasks import job_run
from ops.signals import timer_compact
from tests.support.processes import celery_worker, wait_until


def fired_in_order(timer: Timer) -> list:
    """Run every entry of `timer` that is due, as the worker's loop does; return their args."""
    fired = []
    for _delay, entry in timer:
        if entry is None:
            break
        fired.append(entry.args)
        timer.apply_entry(entry)
    return fired


def test_the_cancelled_entries_go_and_the_rest_fire_in_order():
    timer = Timer()
    now = time.monotonic()
    entries = [timer.call_at(now - 10 + index / 100, lambda *args: None, (index,)) for index in range(200)]
    later = [timer.call_after(3600, lambda: None) for _ in range(300)]
    for entry in entries[::3] + later[:299]:
        entry.cancel()
    assert timer_compact(timer) == len(entries[::3]) + 299
    assert len(timer._queue) == 200 - len(entries[::3]) + 1
    assert timer_compact(timer) == 0  # nothing more to drop
    kept = [(index,) for index in range(200) if index % 3]
    assert fired_in_order(timer) == kept  # due ones, in order; the one still to come stays
    assert [item.entry for item in timer._queue] == [later[299]]


@given(st.lists(st.tuples(st.floats(-100, 100), st.booleans()), max_size=60))
def test_a_compacted_heap_is_a_heap_of_the_live_entries(plan):
    timer = Timer()
    base = time.monotonic()
    entries = []
    for offset, cancelled in plan:
        entry = timer.call_at(base + offset, lambda: None)
        if cancelled:
            entry.cancel()
        entries.append((entry, cancelled))
    queue = timer._queue
    timer_compact(timer)
    assert timer._queue is queue  # the loop holds this list: changed in place
    assert {id(item.entry) for item in queue} == {id(entry) for entry, cancelled in entries if not cancelled}
    assert [heapq.heappop(queue)[0] for _ in range(len(queue))] == sorted(
        base + offset for offset, cancelled in plan if not cancelled)


def test_a_repeating_entry_keeps_repeating_after_a_compaction():
    timer = Timer()
    calls = []
    timer.call_repeatedly(0.01, lambda: calls.append(1))
    for _ in range(50):
        timer.call_after(3600, lambda: None).cancel()
    time.sleep(0.02)
    fired_in_order(timer)
    timer_compact(timer)
    time.sleep(0.02)
    fired_in_order(timer)
    assert len(calls) == 2 and len(timer._queue) == 1


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_drops_the_time_limits_of_the_jobs_it_ran():
    """A real worker, its time limits as shipped (JOBS_TIME_LIMIT): each job's limit is a timer
    entry of the main process, cancelled when the job ends, and the compaction drops them."""
    queue = f"timer-{uuid.uuid4().hex[:6]}"
    process = celery_worker(name=queue, queues=queue, concurrency=1, extra_args=["--loglevel", "DEBUG"],
                            env={"WORKER_TIMER_COMPACT_INTERVAL": "0.5"}).start()
    try:
        with mock.patch("jobs.services.transitions.job_dispatch"):  # sent below, to this worker's queue only
            jobs = [job_submit(kind="demo.noop", input={})[0] for _ in range(20)]
        for job in jobs:
            job_run.apply_async(args=[str(job.pk)], shadow=job.kind, queue=queue)
        wait_until(lambda: Job.objects.filter(pk__in=[job.pk for job in jobs], status="completed").count() == 20,
                   timeout=60)

        def dropped() -> int:
            return sum(int(found) for found in re.findall(r"worker timer: (\d+) cancelled entries dropped",
                                                          process.output))

        wait_until(lambda: dropped() >= 20, timeout=10,
                   message=f"the worker dropped {dropped()} of 20 cancelled time limits:\n{process.output[-3000:]}")
    finally:
        process.stop()


def test_an_interval_of_zero_turns_the_compaction_off(settings):
    """WORKER_TIMER_COMPACT_INTERVAL=0 leaves the timer alone (a zero interval would otherwise spin
    the main process's loop)."""
    from types import SimpleNamespace

    from ops.signals import _timer_compaction_begins

    timer = Timer()
    settings.WORKER_TIMER_COMPACT_INTERVAL = 0
    _timer_compaction_begins(SimpleNamespace(timer=timer))
    assert timer._queue == []
    settings.WORKER_TIMER_COMPACT_INTERVAL = 60
    _timer_compaction_begins(SimpleNamespace(timer=timer))
    assert len(timer._queue) == 1
