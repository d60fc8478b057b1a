"""What a platform process holds once it is ready stays out of the garbage collector's full passes
(taskplatform/heap.py): they held every request in flight for a fifth of a second."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from taskplatform.heap import WEB_THRESHOLDS

BASE_DIR = Path(__file__).resolve().parent.parent


def test_the_web_process_freezes_what_it_loaded_and_collects_less_often():
    code = "import gc, json, taskplatform.asgi; print(json.dumps([gc.get_freeze_count(), gc.get_threshold()]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(BASE_DIR)}, check=True).stdout
    frozen, thresholds = json.loads(out.strip().splitlines()[-1])
    assert frozen > 50_000  # Django, DRF, Channels, the apps: far more than this
    assert tuple(thresholds) == WEB_THRESHOLDS


def _run(code: str, *args: str) -> str:
    return subprocess.run([sys.executable, *args] if args else [sys.executable, "-c", code], cwd=BASE_DIR,
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(BASE_DIR)}).stdout.strip().splitlines()[-1]


def test_a_process_loads_without_collecting_then_collects_once_its_apps_are_ready():
    """Loading makes objects that live as long as the process: no collection walks them meanwhile,
    and once the apps are ready they are frozen and the collector is on (taskplatform/heap.py)."""
    code = ("import gc, json\n"
            "passes = []\n"
            "gc.callbacks.append(lambda phase, info: phase == 'start' and passes.append(info['generation']))\n"
            "import django\n"
            "django.setup()\n"
            "print(json.dumps([passes.count(2), gc.isenabled(), gc.get_freeze_count()]))")
    full_passes, collecting, frozen = json.loads(_run(code))
    assert full_passes == 0  # at Python's defaults, two full passes over everything loaded
    assert collecting is True
    assert frozen > 50_000


def test_a_management_command_runs_with_the_collector_on_and_what_it_loaded_frozen():
    out = _run("", "manage.py", "shell", "-c", "import gc; print(gc.isenabled(), gc.get_freeze_count() > 50_000)")
    assert out == "True True"


def test_a_worker_freezes_its_objects_before_it_forks_a_pool_process():
    from celery import signals

    import taskplatform.celery  # noqa: F401  (connects the receiver)

    gc.unfreeze()
    try:
        signals.worker_before_create_process.send(sender=None)
        assert gc.get_freeze_count() > 50_000
    finally:
        gc.unfreeze()


def test_a_pool_process_lets_its_push_thread_run_within_half_a_millisecond():
    """The events' push thread waits for the GIL while a job's Python runs: up to the switch
    interval, 5 ms by default (taskplatform/celery.py)."""
    from celery import signals

    from taskplatform.celery import POOL_SWITCH_INTERVAL, _switch_threads_sooner

    connected = [receiver() if isinstance(receiver, weakref.ReferenceType) else receiver
                 for _, receiver in signals.worker_process_init.receivers]
    assert _switch_threads_sooner in connected
    before = sys.getswitchinterval()
    try:
        _switch_threads_sooner()
        assert sys.getswitchinterval() == POOL_SWITCH_INTERVAL < 0.001
    finally:
        sys.setswitchinterval(before)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_job_runs_in_a_pool_process_with_a_frozen_heap_and_the_short_switch_interval(worker):
    """The same, in a real worker: its pool process was forked from a frozen main process."""
    from jobs.models import Job
    from jobs.services import job_submit
    from taskplatform.celery import POOL_SWITCH_INTERVAL
    from tests.support.processes import wait_until

    job, _ = job_submit(kind="test.process_state", input={})
    wait_until(lambda: Job.objects.filter(pk=job.pk, status=Job.Status.COMPLETED).exists(), timeout=30,
               message=f"job {job.pk} did not complete")
    state = Job.objects.get(pk=job.pk).result
    assert state["frozen"] > 50_000
    assert state["collecting"] is True
    assert state["switch_interval"] == POOL_SWITCH_INTERVAL
