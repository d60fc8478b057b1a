"""What the worker's pool is built from, as the environment sets it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import child_env

ROOT = Path(__file__).resolve().parents[1]

# The pool Celery's worker builds from these settings (billiard refuses a bad value at once).
PROBE = """
import django
django.setup()
from django.conf import settings
from celery.concurrency.asynpool import AsynPool
print(repr(settings.CELERY_WORKER_MAX_TASKS_PER_CHILD))
pool = AsynPool(processes=1, maxtasksperchild=settings.CELERY_WORKER_MAX_TASKS_PER_CHILD, threads=False)
pool.terminate()
print("pool built")
"""


@pytest.mark.parametrize(("value", "expected"), [("0", "None"), ("250", "250"), (None, "1000")])
def test_worker_max_tasks_per_child_of_zero_means_never(value, expected):
    extra = {} if value is None else {"WORKER_MAX_TASKS_PER_CHILD": value}
    env = child_env(**extra)
    if value is None:
        env.pop("WORKER_MAX_TASKS_PER_CHILD", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [expected, "pool", "built"]
