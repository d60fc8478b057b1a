"""`make run`'s supervisor, for real: in a fresh copy of the project (no `var/`) with
DATABASE_URL and REDIS_URL set, it starts the platform (beat stays up and beats), restarts a
killed worker, and on SIGTERM stops every process it started (Celery's pool children included)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.processes import BASE_DIR, ManagedProcess, child_env, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.timeout(300)]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str, status: int, **kwargs) -> bool:
    try:
        return httpx.get(url, timeout=2, **kwargs).status_code == status
    except httpx.HTTPError:
        return False


def still_running(proc: psutil.Process) -> bool:
    """True for a process that exists and is not a zombie waiting to be reaped."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def service_leader(supervisor: psutil.Process, command: str) -> psutil.Process | None:
    """The supervisor's child running `celery ... <command>` (worker, beat, flower)."""
    for child in supervisor.children():
        try:
            cmdline = child.cmdline()
            if command in cmdline[1:] and "platform" not in cmdline:  # not the platform worker
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def kill_tree(processes: list[psutil.Process]) -> None:
    for proc in processes:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def fresh_copy(target: Path) -> Path:
    """The project's files as a fresh clone has them: no var/, no .env, no virtualenv (the
    supervisor runs this interpreter's), no caches."""
    shutil.copytree(BASE_DIR, target, ignore=shutil.ignore_patterns(
        ".git", ".venv", "var", ".env", "__pycache__", ".pytest_cache", ".ruff_cache", "results"))
    return target


PROBE_TOKEN = "supervisor-probe-token"  # /readyz's detail is for staff and the metrics token


def assert_nice(expected: int, *processes: psutil.Process) -> None:
    """Each of `processes` runs at nice `expected`; each that leads its session, with its
    autogroup at the same (where the kernel has autogroups)."""
    from devtools.priority import autogroup_nice

    for proc in processes:
        assert proc.nice() == expected, (proc.pid, proc.cmdline(), proc.nice())
        if os.getsid(proc.pid) == proc.pid and autogroup_nice(proc.pid) is not None:
            assert autogroup_nice(proc.pid) == expected, (proc.pid, proc.cmdline())


def readyz_checks(url: str) -> dict:
    try:
        return httpx.get(url, timeout=5, headers={"Authorization": f"Bearer {PROBE_TOKEN}"}).json().get("checks") or {}
    except (httpx.HTTPError, ValueError):
        return {}


def test_supervisor_starts_restarts_and_stops_everything(transactional_db, tmp_path):
    clone = fresh_copy(tmp_path / "clone")
    port, flower_port = free_port(), free_port()
    env = child_env(
        HOST="127.0.0.1",
        PORT=str(port),
        FLOWER_PORT=str(flower_port),
        REDIS_KEY_PREFIX=f"test-supervisor-{uuid.uuid4().hex[:8]}:",
        WORKER_CONCURRENCY="2",
        WAITS_DUE_INTERVAL="1",
        SCHEDULER_HEARTBEAT_INTERVAL="1",
        METRICS_TOKEN=PROBE_TOKEN,
    )
    assert env["DATABASE_URL"].startswith("postgres") or "sqlite" in env["DATABASE_URL"]
    assert env["REDIS_URL"]  # the real services, as CI has them: nothing else makes var/
    env.pop("FLOWER_BASIC_AUTH", None)  # the `make run` default: admin:admin
    env.pop("WORKER_NICE", None)  # the default: the workers at nice 10
    supervisor = ManagedProcess("supervisor", [sys.executable, "-m", "devtools.supervisor"], env, cwd=clone)
    supervisor.start()
    assert supervisor.proc is not None
    sup = psutil.Process(supervisor.proc.pid)
    seen: list[psutil.Process] = []
    try:
        base = f"http://127.0.0.1:{port}"
        flower = f"http://127.0.0.1:{flower_port}/"
        wait_until(lambda: answers(f"{base}/healthz", 200), timeout=120,
                   message=f"/healthz never answered 200:\n{supervisor.output[-4000:]}")
        wait_until(lambda: answers(flower, 401), timeout=60,
                   message=f"Flower never asked for credentials:\n{supervisor.output[-4000:]}")
        assert answers(flower, 200, auth=("admin", "admin"), follow_redirects=True)
        supervisor.wait_for_output("taskplatform is running", timeout=30)
        assert f"{base}/healthz" in supervisor.output
        assert f"{base}/admin/" in supervisor.output
        assert f"{flower}  (admin / admin)" in supervisor.output

        # Beat stays up and beats: /readyz's scheduler check turns ok once the passes run.
        wait_until(lambda: readyz_checks(f"{base}/readyz").get("scheduler", "").startswith("ok"), timeout=90,
                   message=f"the scheduler never beat: {readyz_checks(f'{base}/readyz')}\n{supervisor.output[-4000:]}")
        assert not [line for line in supervisor.lines if line.startswith("supervisor| beat (pid")], \
            "beat died:\n" + supervisor.output[-4000:]

        # Kill the worker (not its pool): the supervisor clears its orphans and starts a new one.
        # Both workers (jobs and platform) up before one is killed.
        wait_until(lambda: sum("ready." in line for line in supervisor.lines) >= 2, timeout=120,
                   message=f"the workers never got ready:\n{supervisor.output[-4000:]}")
        worker = service_leader(sup, "worker")
        assert worker is not None, [child.cmdline() for child in sup.children()]
        pool = worker.children()
        assert pool, "the worker has no pool processes"
        # Both workers, their pool processes too, run below the web's priority (WORKER_NICE's
        # default), each in a session of its own whose autogroup has the same nice value.
        platform_worker = next(child for child in sup.children() if "platform@%h" in child.cmdline())
        web = next(child for child in sup.children() if "uvicorn" in " ".join(child.cmdline()))
        assert_nice(10, worker, *pool, platform_worker, *platform_worker.children())
        assert_nice(0, web, *web.children())
        seen += [worker, *pool]
        os.kill(worker.pid, signal.SIGKILL)
        supervisor.wait_for_output(f"worker (pid {worker.pid}) exited with code -9", timeout=10)
        supervisor.wait_for_output("restarting worker", timeout=30)
        restarted = wait_until(
            lambda: (leader := service_leader(sup, "worker")) and leader.pid != worker.pid and leader,
            timeout=30, message="no new worker process",
        )
        wait_until(lambda: sum("ready." in line for line in supervisor.lines) >= 3, timeout=120,
                   message=f"the restarted worker never got ready:\n{supervisor.output[-4000:]}")
        assert restarted.is_running()
        assert_nice(10, restarted, *restarted.children())  # a restart runs at the same priority
        assert not [proc for proc in pool if still_running(proc)], "the killed worker's pool outlived it"

        # SIGTERM: everything it started goes, within 20 s, and it exits 0.
        tree = sup.children(recursive=True)
        seen += tree
        assert len([p for p in tree if p.ppid() == sup.pid]) == 5, [p.cmdline() for p in tree]
        supervisor.proc.send_signal(signal.SIGTERM)
        assert supervisor.proc.wait(timeout=20) == 0, supervisor.output[-4000:]
        # A zombie reparented to init is already dead; give init a moment to reap it anyway.
        wait_until(lambda: not [proc for proc in tree if still_running(proc)], timeout=5,
                   message=f"left behind: {[proc.pid for proc in tree if still_running(proc)]}")
        assert "supervisor| stopped" in supervisor.output
        if "sqlite" not in env["DATABASE_URL"]:
            assert not (clone / "var").exists(), "something wrote under var/ with DATABASE_URL and REDIS_URL set"
    finally:
        if supervisor.proc.poll() is None:
            seen += sup.children(recursive=True)
            supervisor.kill()
        kill_tree(seen)


def test_web_processes_one_per_core_at_most_four_unless_web_concurrency_says(monkeypatch):
    from devtools import supervisor

    for cores, expected in ((None, 1), (1, 1), (2, 2), (3, 3), (16, 4)):
        monkeypatch.setattr(supervisor.os, "cpu_count", lambda cores=cores: cores)
        assert supervisor.web_processes({}) == expected
        assert supervisor.web_processes({"WEB_CONCURRENCY": " "}) == expected
    assert supervisor.web_processes({"WEB_CONCURRENCY": "7"}) == 7
    for wrong in ("0", "-2", "two", "1.5"):
        with pytest.raises(SystemExit, match=f"WEB_CONCURRENCY .*{wrong!r}"):
            supervisor.web_processes({"WEB_CONCURRENCY": wrong})
    # What make run starts: uvicorn with that many processes (it reads WEB_CONCURRENCY too, but the
    # command line says it where an operator reads it: in `ps` and the supervisor's log).
    web = next(service for service in supervisor.build_services({"WEB_CONCURRENCY": "3"}) if service.name == "web")
    assert web.argv[web.argv.index("--workers") + 1] == "3"


# A process's output: lines at a steady rate (as an access log under load), a burst larger than a
# pipe holds, a Windows line end, bytes that are not UTF-8, and a last line without its line break.
CHATTY_CHILD = r"""
import os, sys, time
out = sys.stdout.buffer
for i in range(300):
    out.write(b"steady %d\n" % i); out.flush()
    time.sleep(0.001)
out.write(b"".join(b"burst %d %s\n" % (i, b"x" * 90) for i in range(2000))); out.flush()
out.write(b"windows\r\nnot utf-8 \xff\xfe end\nno line break at the end")
out.flush()
"""


def test_a_process_output_is_copied_in_batches_of_whole_lines_in_order(monkeypatch, capsys):
    """The supervisor copies a process's output a batch at a time (OUTPUT_BATCH_SECONDS), not a
    write per line: 300 lines written over a third of a second or more take a handful of writes,
    not 300. Every line arrives whole, prefixed, in order; a burst larger than a pipe holds loses
    nothing; and the last line, without its line break, is copied once the process ends."""
    from devtools import supervisor

    writes: list[str] = []
    say_block = supervisor.say_block

    def counted(name: str, text: str) -> None:
        writes.append(text)
        say_block(name, text)

    monkeypatch.setattr(supervisor, "say_block", counted)
    service = supervisor.Service("chatty", [sys.executable, "-c", CHATTY_CHILD], dict(os.environ))
    service.start()
    assert service.proc is not None
    assert service.proc.wait(timeout=60) == 0
    service.join_output(timeout=10)

    copied = [line for line in capsys.readouterr().out.splitlines() if line.startswith("chatty    | ")]
    expected = ([f"steady {i}" for i in range(300)] + [f"burst {i} {'x' * 90}" for i in range(2000)]
                + ["windows", "not utf-8 \ufffd\ufffd end", "no line break at the end"])
    assert [line.removeprefix("chatty    | ") for line in copied] == expected
    # Line by line this took 2,303 writes; in batches, the steady lines share a few.
    steady_writes = [text for text in writes if "steady" in text]
    assert len(steady_writes) < 60, f"{len(steady_writes)} writes for 300 steady lines"
    assert len(writes) < 120, f"{len(writes)} writes for 2,303 lines"
