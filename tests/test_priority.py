"""`make run`'s workers below the web's CPU priority (devtools/priority.py), on real processes:
the process's nice value, which its children inherit, and its session's autogroup's, which is
what Linux shares the CPU by when every service runs in a session of its own."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import priority

# A child that forks once it is told to (a Celery worker forks its pool after its start), then
# prints its child's pid and waits.
FORKS_LATER = r"""
import os, sys, time
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's nice values and autogroups")


def start(new_session: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FORKS_LATER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=new_session)


def stop(proc: subprocess.Popen, *more: int) -> None:
    for pid in more:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait(timeout=10)


def test_a_service_in_its_own_session_gets_the_nice_value_and_its_autogroup_too():
    # Above the runner's own (an unprivileged process may only raise a nice value).
    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
    proc = start(new_session=True)
    forked = None
    try:
        done = priority.lower_priority(proc.pid, nice)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == nice
        assert "process" in done
        if Path(f"/proc/{proc.pid}/autogroup").exists():
            assert "autogroup" in done
            assert priority.autogroup_nice(proc.pid) == nice
        # What it forks from now on (a worker's pool processes) inherits the value.
        proc.stdin.write("fork\n")
        proc.stdin.flush()
        forked = int(proc.stdout.readline())
        assert os.getpriority(os.PRIO_PROCESS, forked) == nice
    finally:
        stop(proc, *([forked] if forked else []))


def test_a_process_in_the_callers_session_leaves_that_session_alone():
    """Only a process leading its own session has its autogroup changed: never the session it
    shares with whoever started it (a terminal's, the test runner's)."""
    ours, our_nice = priority.autogroup_nice(os.getpid()), os.getpriority(os.PRIO_PROCESS, os.getpid())
    proc = start(new_session=False)
    try:
        assert priority.lower_priority(proc.pid, 19) == ["process"]
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 19
        assert priority.autogroup_nice(os.getpid()) == ours
        assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == our_nice
    finally:
        stop(proc)


def test_a_session_in_the_kernels_default_group_has_no_autogroup_nice(monkeypatch):
    """Pid 1's session, and any that inherits it without a `setsid` (a CI runner started by init),
    is in no autogroup: its file reads empty, and that is "none", not an error."""
    if Path("/proc/1/autogroup").exists() and Path("/proc/1/autogroup").read_text() == "":
        assert priority.autogroup_nice(1) is None
    monkeypatch.setattr(Path, "read_text", lambda path, *args, **kwargs: "")
    assert priority.autogroup_nice(os.getpid()) is None


def test_nice_0_changes_nothing_and_a_process_gone_is_skipped():
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    proc = start(new_session=True)
    try:
        assert priority.lower_priority(proc.pid, 0) == []
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == ours
    finally:
        stop(proc)
    assert priority.lower_priority(proc.pid, 10) == []  # reaped: no such process


def test_the_kernels_pace_for_autogroup_changes_is_waited_out(monkeypatch, tmp_path):
    """Unprivileged, the kernel takes one autogroup change every 0.1 s and answers EAGAIN before:
    the write is tried again, for a second at most."""
    target = tmp_path / "autogroup"
    tries = []
    real_write = Path.write_text

    def write(path, text, *args, **kwargs):
        tries.append(text)
        if len(tries) < 3:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return real_write(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write)
    assert priority._write_autogroup(target, 10)
    assert tries == ["10", "10", "10"] and target.read_text() == "10"

    def refuse(path, text, *args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(Path, "write_text", refuse)
    monkeypatch.setattr(priority, "AUTOGROUP_RETRY_SECONDS", 0.1)
    assert not priority._write_autogroup(target, 10)


def test_worker_nice_is_a_whole_number_from_0_to_19():
    assert priority.nice_value(None) == priority.DEFAULT_WORKER_NICE == 10
    assert priority.nice_value(" ") == 10
    assert priority.nice_value("0") == 0
    assert priority.nice_value(" 19 ") == 19
    for wrong in ("-1", "20", "ten", "2.5"):
        with pytest.raises(SystemExit, match=f"WORKER_NICE must be a whole number from 0 .* to 19 .*got {wrong!r}"):
            priority.nice_value(wrong)


def test_make_run_starts_both_workers_below_the_web(monkeypatch):
    from devtools import supervisor

    services = {service.name: service for service in supervisor.build_services({})}
    assert services["worker"].nice == services["platform-worker"].nice == 10
    assert services["web"].nice == services["beat"].nice == services["flower"].nice == 0
    services = {service.name: service for service in supervisor.build_services({"WORKER_NICE": "0"})}
    assert services["worker"].nice == services["platform-worker"].nice == 0
    with pytest.raises(SystemExit, match="WORKER_NICE"):
        supervisor.build_services({"WORKER_NICE": "high"})
