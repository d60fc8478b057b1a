"""Celery's prefork pool, with a pool process replaced as soon as it exits.

A pool process leaves after `WORKER_MAX_TASKS_PER_CHILD` tasks, or once it holds more than
`WORKER_MAX_MEMORY_PER_CHILD_MB`, and Celery's pool (`celery.concurrency.asynpool`) starts its
replacement when it sees the exit: the process's sentinel pipe becomes readable, the pool stops
watching that pipe and reaps the exited processes (`maintain_pool`). But the pipe closes as the
process closes its files on its way out, a moment before the kernel lets its parent reap it. A
pool that looks in that moment finds the process still running, and no longer watches for its
exit: the replacement waits for the pool's next periodic look, every 5 seconds
(https://github.com/celery/celery/issues/9588). Under an even load every pool process reaches its
task limit at about the same time, so with two of them the worker took no job for up to 5 s: a
woken job waited 4.6 s for its claim in a bench run (bench/README.md, "A pool process's
replacement, waited for").

Here the pool waits for the process's exit before it looks (bounded: the process has closed its
last file by then), and looks on its own every second as well, for an exit no pipe announced.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.concurrency import asynpool, prefork

# How long the exit of a process whose sentinel pipe closed is waited for before the pool reaps:
# it takes microseconds; the bound is for a process that closed the pipe and lives on.
EXIT_WAIT_SECONDS = 0.1
# The pool's own periodic look for exited processes (Celery's: 5 s): a few system calls a look.
MAINTAIN_EVERY_SECONDS = 1.0


def process_exit_waited(proc: Any, timeout: float = EXIT_WAIT_SECONDS) -> bool:
    """Wait up to `timeout` seconds until the pool process `proc` can be reaped (its exit code
    known), without blocking longer: whether it exited."""
    popen = proc._popen
    if popen is None:
        return True
    deadline = time.monotonic() + timeout
    while popen.poll(os.WNOHANG) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)
    return True


class AsynPool(asynpool.AsynPool):
    def _event_process_exit(self, hub: Any, proc: Any) -> None:
        process_exit_waited(proc)
        super()._event_process_exit(hub, proc)

    @property
    def timers(self) -> dict:
        return {self.maintain_pool: MAINTAIN_EVERY_SECONDS}


class TaskPool(prefork.TaskPool):
    """The worker's pool (settings: CELERY_WORKER_POOL). A prefork pool to Celery and its Django
    fix-up, which tell one by its class and its module's name."""

    Pool = AsynPool
