"""`taskplatform.prefork`: the wait for a pool process's exit is bounded, and ends with it."""

from __future__ import annotations

import time

from billiard import Process

from taskplatform.prefork import process_exit_waited


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_the_wait_for_an_exit_ends_with_the_exit_and_never_outlasts_its_bound():
    lingering = Process(target=_sleep, args=(30,))
    lingering.start()
    try:
        started = time.monotonic()
        assert process_exit_waited(lingering, timeout=0.05) is False  # still running: not waited for
        assert time.monotonic() - started < 1.0
        lingering.terminate()
        assert process_exit_waited(lingering, timeout=5.0) is True
        assert lingering.exitcode is not None  # reaped: the pool's next look finds it gone
    finally:
        if lingering.exitcode is None:
            lingering.kill()
            lingering.join()

    quick = Process(target=_sleep, args=(0,))
    quick.start()
    assert process_exit_waited(quick, timeout=5.0) is True
    assert quick.exitcode == 0
