"""A periodic pass for the tests: slow enough that duplicate messages meet at its lock."""

import time

from celery import shared_task

from jobs.periodic import PeriodicPassTask


@shared_task(name="testkinds.slow_pass", base=PeriodicPassTask, ignore_result=True)
def slow_pass(seconds: float = 0.3) -> float:
    """Does nothing for `seconds` (tests/chaos/test_scheduler.py sends it several times at once)."""
    time.sleep(seconds)
    return seconds
