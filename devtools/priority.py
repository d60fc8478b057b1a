"""The CPU priority of `make run`'s background processes: the workers yield the cores to the web.

On one machine the web processes, the workers and PostgreSQL share the cores. A request waits for
a core whenever a worker holds it, and under load that wait is the API's tail: with the workers
at the web's priority, `POST /api/jobs/` paced to 300 requests a second on two cores answered with
a p99 of 46–70 ms; with the workers' priority lowered (nice 10), 29–39 ms, in the same minutes
(bench/README.md, "The workers yield the cores to the web"). The jobs lose nothing they would
have had: a worker still takes every core the web leaves idle, and under contention it gets about
a tenth of the web's share instead of an equal one. Jobs wait in their queue, durably, a little
longer; requests do not.

Linux schedules by *autogroup* where it is enabled (most desktop and server kernels): each session
is one group, and the groups share the CPU evenly whatever the nice values of the processes in
them. `make run` starts every service in a session of its own, so a process's nice value alone
would change nothing between the web and the worker; the session's group has a nice value of its
own (`/proc/<pid>/autogroup`, see sched(7)), and that is the one that counts. Without autogroup
(disabled, or the processes in a CPU cgroup of their own, as in a container) the process's nice
value counts, and the worker's pool processes inherit it. So both are set.

Raising a nice value needs no privilege. The kernel takes at most one autogroup change every
0.1 s from an unprivileged process (EAGAIN before that): the write is retried for a second.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

# The nice value `make run` gives the workers unless WORKER_NICE says otherwise: a weight of 110
# against the web's 1024 (the kernel's table, sched_prio_to_weight).
DEFAULT_WORKER_NICE = 10
AUTOGROUP_RETRY_SECONDS = 1.0


def nice_value(text: str | None) -> int:
    """WORKER_NICE's value: a whole number 0–19 (0: the same priority as the web); the default
    when unset or blank. Anything else stops with a message naming the setting."""
    value = (text or "").strip()
    if not value:
        return DEFAULT_WORKER_NICE
    try:
        nice = int(value)
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise SystemExit(f"WORKER_NICE must be a whole number from 0 (the web's priority) to 19 (the lowest); "
                         f"got {value!r}")
    return nice


def lower_priority(pid: int, nice: int) -> list[str]:
    """Give process `pid` the nice value `nice` (its children from now on inherit it) and, when it
    leads a session of its own, give that session's autogroup the same. Returns what was set
    ("process", "autogroup"); a process that is gone, or a setting the system refuses, is
    skipped. The caller's own session is never touched: only a process that leads its session."""
    done: list[str] = []
    if nice <= 0:
        return done
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
        done.append("process")
    except (ProcessLookupError, PermissionError):
        return done
    try:
        leads_its_session = os.getsid(pid) == pid
    except ProcessLookupError:
        return done
    autogroup = Path(f"/proc/{pid}/autogroup")
    if leads_its_session and autogroup.exists() and _write_autogroup(autogroup, nice):
        done.append("autogroup")
    return done


def _write_autogroup(path: Path, nice: int) -> bool:
    deadline = time.monotonic() + AUTOGROUP_RETRY_SECONDS
    while True:
        try:
            path.write_text(str(nice))
            return True
        except OSError as exc:
            if exc.errno != errno.EAGAIN or time.monotonic() >= deadline:
                return False  # gone, not allowed, or no autogroups here
        time.sleep(0.02)


def autogroup_nice(pid: int) -> int | None:
    """The nice value of the autogroup of process `pid`: None where there are no autogroups, or
    where the process is in none. The file reads empty for a session that never left the kernel's
    default group (pid 1's, and whatever inherits it without a `setsid`, such as a CI runner)."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()  # "/autogroup-42 nice 10", or ""
    except OSError:
        return None
    fields = text.split()
    return int(fields[-1]) if fields else None
