"""What a platform process holds once it is ready stays out of the garbage collector's full passes
(taskplatform/heap.py): they held every request in flight for a fifth of a second."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from taskplatform.heap import WEB_THRESHOLDS

BASE_DIR = Path(__file__).resolve().parent.parent


def test_the_web_process_freezes_what_it_loaded_and_collects_less_often():
    code = "import gc, json, taskplatform.asgi; print(json.dumps([gc.get_freeze_count(), gc.get_threshold()]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(BASE_DIR)}, check=True).stdout
    frozen, thresholds = json.loads(out.strip().splitlines()[-1])
    assert frozen > 50_000  # Django, DRF, Channels, the apps: far more than this
    assert tuple(thresholds) == WEB_THRESHOLDS


def test_a_worker_freezes_its_objects_before_it_forks_a_pool_process():
    from celery import signals

    import taskplatform.celery  # noqa: F401  (connects the receiver)

    gc.unfreeze()
    try:
        signals.worker_before_create_process.send(sender=None)
        assert gc.get_freeze_count() > 50_000
    finally:
        gc.unfreeze()
