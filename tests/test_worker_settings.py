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
print(repr(settings.CELERY_WORKER_MAX_TASKS_PER_CHILD), repr(settings.CELERY_WORKER_MAX_MEMORY_PER_CHILD))
pool = AsynPool(processes=1, maxtasksperchild=settings.CELERY_WORKER_MAX_TASKS_PER_CHILD,
                max_memory_per_child=settings.CELERY_WORKER_MAX_MEMORY_PER_CHILD, threads=False)
pool.terminate()
print("pool built")
"""


def _probe(name: str, value: str | None) -> list[str]:
    env = child_env(**({} if value is None else {name: value}))
    if value is None:
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()


@pytest.mark.parametrize(("value", "expected"), [("0", "None"), ("250", "250"), (None, "10000")])
def test_worker_max_tasks_per_child_of_zero_means_never(value, expected):
    tasks, _memory, *built = _probe("WORKER_MAX_TASKS_PER_CHILD", value)
    assert (tasks, built) == (expected, ["pool", "built"])


# Celery counts the limit in KiB; the setting is in MB.
@pytest.mark.parametrize(("value", "expected"), [("0", "None"), ("300", "307200"), (None, "524288")])
def test_worker_max_memory_per_child_is_in_megabytes_and_zero_means_none(value, expected):
    _tasks, memory, *built = _probe("WORKER_MAX_MEMORY_PER_CHILD_MB", value)
    assert (memory, built) == (expected, ["pool", "built"])
