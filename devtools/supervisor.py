"""Run the whole platform on this machine in the foreground: what `make run` starts.

    python -m devtools.supervisor

It starts the embedded Redis when `REDIS_URL` is unset, migrates, creates the demo accounts
(development settings only), then starts and watches the ASGI server, the Celery worker, the
platform worker (beat's housekeeping), Celery beat and Flower. Each runs in its own process group
with its output prefixed by its name. A process that dies is started again after a short back-off.
Ctrl-C or SIGTERM stops every process it started, pool children included, and exits 0.

A deployment starts the same commands on its own (see docker-compose.yml); this module is only
the local convenience around them. Settings: HOST, PORT, FLOWER_PORT, FLOWER_BASIC_AUTH,
WORKER_CONCURRENCY, WORKER_NICE (see .env.example); like the settings, it reads .env when present, real
environment variables winning. It writes nothing itself: with DATABASE_URL and REDIS_URL set, no
process it starts needs `var/` (beat keeps its schedule in memory, see ops/scheduler.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from devtools import embedded_redis
from devtools.priority import lower_priority, nice_value

BASE_DIR = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# Restart back-off: the first restart waits BACKOFF_MIN seconds, each quick death doubles it up to
# BACKOFF_MAX; a process that stayed up STABLE_AFTER seconds starts again from BACKOFF_MIN.
BACKOFF_MIN = 1.0
BACKOFF_MAX = 30.0
STABLE_AFTER = 30.0
# On stop: how long the processes get to finish (a Celery worker finishes its running tasks).
STOP_GRACE = 10.0
# How long to wait for the ports to answer before printing the URLs anyway.
READY_TIMEOUT = 120.0
LOOP_INTERVAL = 0.2
# A process's output is copied in batches: after a read that emptied its pipe, the next comes this
# many seconds later, with every line written meanwhile, prefixed and written at once. Copied line
# by line, the web server's access log (a line per request) woke the supervisor at every request:
# 28 µs of its CPU a line at 300 lines a second, 5 µs in batches (bench/README.md, "Beat's spin
# before each pass, and make run's output in batches"). A line shows at most this much later; a
# process that fills its pipe (64 KiB) in that time is read again at once.
OUTPUT_BATCH_SECONDS = 0.1
OUTPUT_READ_BYTES = 65536

_print_lock = threading.Lock()


def say(name: str, text: str) -> None:
    """Write one line to stdout as `name | text`, whole, even with several threads writing."""
    say_block(name, f"{text}\n")


def say_block(name: str, text: str) -> None:
    """Write `text`, whole lines each ending with a line break, to stdout with each line as
    `name | line`, in one write: whole, and together, even with several threads writing."""
    prefix = f"{name:<10}| "
    with _print_lock:
        sys.stdout.write(prefix + text[:-1].replace("\n", "\n" + prefix) + "\n")
        sys.stdout.flush()


def log(text: str) -> None:
    """A line from the supervisor itself."""
    say("supervisor", text)


def group_alive(pgid: int) -> bool:
    """True while a process that is not a zombie remains in the process group `pgid`.

    `killpg(pgid, 0)` also succeeds for zombies waiting to be reaped by init, so Linux reads
    `/proc`; elsewhere that is the best there is.
    """
    proc_dir = Path("/proc")
    if not (proc_dir / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat_path in proc_dir.glob("[0-9]*/stat"):
        try:
            text = stat_path.read_text()
        except OSError:  # the process went away while we looked
            continue
        # The command name is in parentheses and may hold spaces; the fields after it are
        # state, ppid, pgrp, ...
        fields = text.rpartition(")")[2].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


@dataclass
class Service:
    """One supervised command: its process, and when to start it again after it died."""

    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = BACKOFF_MIN
    restart_at: float | None = None
    restarts: int = 0
    # The nice value it runs at (devtools/priority.py): the workers yield the cores to the web.
    nice: int = 0
    _pump: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        """Start the command in a new session (so its own process group), output pumped to ours."""
        self.proc = subprocess.Popen(
            self.argv,
            cwd=BASE_DIR,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        # Set before the process has loaded enough to fork (a worker's pool processes inherit it).
        lowered = lower_priority(self.proc.pid, self.nice) if self.nice else []
        assert self.proc.stdout is not None
        self._pump = threading.Thread(target=self._copy_output, args=(self.proc.stdout,), daemon=True)
        self._pump.start()
        at = f" at nice {self.nice} ({' and '.join(lowered)})" if lowered else ""
        log(f"started {self.name} (pid {self.proc.pid}){at}: {' '.join(self._display_argv())}")

    def _display_argv(self) -> list[str]:
        # The full path of the venv's executables and Flower's password are noise in the log.
        shown = [Path(self.argv[0]).name, *self.argv[1:]]
        return ["--basic-auth=***" if arg.startswith("--basic-auth=") else arg for arg in shown]

    def _copy_output(self, stream: IO[bytes]) -> None:
        """Copy the process's output to ours, a batch of whole lines at a time (OUTPUT_BATCH_SECONDS);
        a last line without its line break is copied when the process closes its output."""
        fd = stream.fileno()
        pending = b""
        try:
            while chunk := os.read(fd, OUTPUT_READ_BYTES):
                whole, newline, pending = (pending + chunk).rpartition(b"\n")
                if newline:  # every line of the batch at once (decoded, prefixed), not one by one
                    say_block(self.name, (whole + newline).decode("utf-8", errors="replace").replace("\r\n", "\n"))
                if len(chunk) < OUTPUT_READ_BYTES:  # the pipe is empty: let the next lines gather
                    time.sleep(OUTPUT_BATCH_SECONDS)
        except OSError:
            pass  # the pipe closed under us (the supervisor is exiting)
        finally:
            if pending:
                say(self.name, pending.decode("utf-8", errors="replace").rstrip("\r"))
            stream.close()

    def running(self) -> bool:
        """True while the process itself (the group leader) has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def alive(self) -> bool:
        """True while the process or anything left in its process group still runs."""
        return self.running() or (self.proc is not None and group_alive(self.proc.pid))

    def signal_group(self, signum: int) -> None:
        """Send `signum` to every process in the service's process group.

        Once the leader is reaped its pid may be reused, so an empty group is left alone.
        """
        if self.proc is None or not self.alive():
            return
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        """Ask the service to stop.

        The leader gets SIGTERM first, so a Celery worker does its warm shutdown (its pool
        children finish their tasks; a SIGTERM to the whole group would kill them mid-task);
        should the leader be gone already, the rest of its group gets SIGTERM.
        """
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
        else:
            self.signal_group(signal.SIGTERM)

    def forget_exited(self) -> int:
        """After the leader exited: SIGKILL what it left in its group, drop the process, return its code."""
        assert self.proc is not None and self.proc.returncode is not None
        code = self.proc.returncode
        self.signal_group(signal.SIGKILL)  # e.g. the pool children of a killed Celery worker
        self.join_output(timeout=0.5)
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group (if anything is left in it) and reap the leader."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log(f"{self.name} (pid {self.proc.pid}) did not die on SIGKILL")

    def join_output(self, timeout: float = 1.0) -> None:
        """Wait briefly until the last lines of output have been copied."""
        if self._pump is not None:
            self._pump.join(timeout)


class StopRequested:
    """Set by SIGINT/SIGTERM/SIGHUP; the main loop checks it."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None

    def install(self) -> None:
        """Route the stop signals to this flag instead of the default (die at once)."""
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            log(f"got {signal.Signals(signum).name}: stopping everything")


def read_dotenv(path: Path) -> dict[str, str]:
    """The `KEY=value` lines of a .env file; blank lines, comments and `export ` are skipped."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def child_environment() -> dict[str, str]:
    """The environment every child gets: .env under ours (as the settings read it), unbuffered."""
    env = {**read_dotenv(BASE_DIR / ".env"), **os.environ}
    env.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# Web processes when WEB_CONCURRENCY is not set: one per core, at most this many. Each is a
# Python process with its own GIL and its own live fan-out (the kernel spreads the sockets over
# them). On a 2-core machine two halved the pass of an event over 1,000 watchers (p99 33.5 and
# 36.0 ms against 48.2 and 176 ms) and did not slow the API (bench/README.md).
MAX_DEFAULT_WEB_PROCESSES = 4


def web_processes(env: dict[str, str]) -> int:
    """The web server's processes: WEB_CONCURRENCY, else one per core (at most 4)."""
    value = (env.get("WEB_CONCURRENCY") or "").strip()
    if not value:
        return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_WEB_PROCESSES))
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise SystemExit(f"WEB_CONCURRENCY must be a whole number of web processes, 1 or more; got {value!r}")
    return count


def build_services(env: dict[str, str]) -> list[Service]:
    """The processes of the platform, each from this interpreter's virtualenv."""
    host = env.get("HOST") or "127.0.0.1"
    port = env.get("PORT") or "8000"
    flower_port = env.get("FLOWER_PORT") or "5555"
    flower_auth = env.get("FLOWER_BASIC_AUTH") or "admin:admin"
    celery = str(VENV_BIN / "celery")

    worker = [celery, "-A", "taskplatform", "worker", "-l", "INFO"]
    # Both workers run below the web's priority: on one machine a request never waits for a core a
    # job holds (devtools/priority.py; WORKER_NICE=0 gives them the web's).
    nice = nice_value(env.get("WORKER_NICE"))
    if env.get("WORKER_CONCURRENCY"):
        worker += ["--concurrency", env["WORKER_CONCURRENCY"]]
    # The debug pages are the web server's; Celery warns against DEBUG in its processes (Django
    # then records every SQL statement), so they run without it.
    background = {**env, "DJANGO_DEBUG": "false"}
    # Flower switches the workers' task events on every few seconds unless told not to; it does
    # so only when WORKER_TASK_EVENTS asks for them (settings: what they cost, what Flower shows
    # without them).
    task_events = env.get("WORKER_TASK_EVENTS", "").strip().lower() in {"1", "true", "yes", "on"}
    flower_env = {**background, "FLOWER_ENABLE_EVENTS": env.get("FLOWER_ENABLE_EVENTS", str(task_events).lower())}
    return [
        Service(
            "web",
            # Django's ASGI handler does not speak the lifespan protocol; saying so keeps the log clean.
            # Progress frames are small JSON: compressing each costs about a third of the
            # server's CPU per message (bench/progress.py) for little saving.
            [str(VENV_BIN / "uvicorn"), "taskplatform.asgi:application", "--host", host, "--port", port,
             "--lifespan", "off", "--ws-per-message-deflate", "false",
             "--timeout-graceful-shutdown", str(int(STOP_GRACE // 2)), "--workers", str(web_processes(env))],
            env,
        ),
        Service("worker", worker, background, nice=nice),
        # Beat's housekeeping on a slot of its own (settings.JOBS_PLATFORM_QUEUE, see taskplatform/celery.py).
        Service(
            "platform-worker",
            [celery, "-A", "taskplatform", "worker", "-l", "INFO", "-Q", "platform", "--concurrency", "1",
             "--hostname", "platform@%h"],
            background,
            nice=nice,
        ),
        # Beat sends the periodic passes while it holds the scheduler's lease (ops/scheduler.py);
        # it writes no schedule file.
        Service("beat", [celery, "-A", "taskplatform", "beat", "-l", "INFO"], background),
        Service(
            "flower",
            [celery, "-A", "taskplatform", "flower", f"--port={flower_port}", f"--address={host}",
             f"--basic-auth={flower_auth}"],
            flower_env,
        ),
    ]


def manage(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `manage.py ARGS` to completion, its output captured."""
    return subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), *args],
        cwd=BASE_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )


def prepare_database(env: dict[str, str]) -> bool:
    """Migrate, then create the demo accounts if the settings allow it; True if they exist."""
    log("migrating the database")
    result = manage(["migrate", "--noinput"], env)
    for line in result.stdout.splitlines():
        say("migrate", line)
    if result.returncode != 0:
        raise SystemExit(f"migrate failed (exit {result.returncode}); not starting")

    result = manage(["ensure_demo_accounts"], env)
    for line in result.stdout.splitlines():
        say("accounts", line)
    if result.returncode == 0:
        return True
    if "DJANGO_DEBUG is off" in result.stdout:
        log("skipping the demo accounts: DJANGO_DEBUG is off")
    else:
        log(f"could not create the demo accounts (exit {result.returncode}); continuing without them")
    return False


def reachable_host(host: str) -> str:
    """The address a local client uses for a server bound to `host` (a wildcard means loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def url_host(host: str) -> str:
    """`host` as written in a URL (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host else host


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def print_banner(env: dict[str, str], demo_accounts: bool, ready: bool) -> None:
    """Print where everything is: the app, admin, health check, Flower and the accounts."""
    host = url_host(reachable_host(env.get("HOST") or "127.0.0.1"))
    base = f"http://{host}:{env.get('PORT') or '8000'}"
    flower = f"http://{host}:{env.get('FLOWER_PORT') or '5555'}/"
    if env.get("FLOWER_BASIC_AUTH"):
        user = env["FLOWER_BASIC_AUTH"].split(",")[0].partition(":")[0]
        flower_login = f"user {user}, password from FLOWER_BASIC_AUTH"
    else:
        flower_login = "admin / admin"
    rows = [
        ("App", f"{base}/jobs/"),
        ("Admin", f"{base}/admin/"),
        ("Reviewer inbox", f"{base}/admin/approvals/question/"),
        ("API docs", f"{base}/api/docs/"),
        ("Health", f"{base}/healthz"),
        ("Flower", f"{flower}  ({flower_login})"),
    ]
    if demo_accounts:
        rows.append(("Demo accounts", "admin / admin (superuser), reviewer / reviewer (reviewer)"))
    rule = "=" * 78
    lines = [rule, "taskplatform is running" if ready else "taskplatform started (not every port answers yet)"]
    lines += [f"  {label + ':':<16}{value}" for label, value in rows]
    lines += ["  Ctrl-C stops everything.", rule]
    with _print_lock:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()


def supervise(services: list[Service], stop: StopRequested, on_ready: Callable[[bool], None],
              ready_ports: list[tuple[str, int]]) -> None:
    """Start every service and keep them running until `stop` is set.

    A service that exits is restarted after its back-off; whatever it left in its process group
    (a killed Celery worker's pool children) is killed first. `on_ready` is called once, when
    every port in `ready_ports` accepts connections (or after READY_TIMEOUT).
    """
    for service in services:
        service.start()
    began = time.monotonic()
    announced = False
    next_probe = 0.0
    while not stop:
        now = time.monotonic()
        for service in services:
            if service.proc is not None and not service.running():
                pid, uptime = service.proc.pid, now - service.started_at
                code = service.forget_exited()
                service.backoff = BACKOFF_MIN if uptime >= STABLE_AFTER else service.backoff
                service.restart_at = now + service.backoff
                log(f"{service.name} (pid {pid}) exited with code {code} after {uptime:.1f}s; "
                    f"restarting it in {service.backoff:g}s")
                service.backoff = min(service.backoff * 2, BACKOFF_MAX)
            elif service.proc is None and service.restart_at is not None and now >= service.restart_at:
                service.restarts += 1
                log(f"restarting {service.name} (restart #{service.restarts})")
                service.start()
        if not announced and now >= next_probe:
            next_probe = now + 0.5
            ready = all(port_open(host, port) for host, port in ready_ports)
            if ready or now - began > READY_TIMEOUT:
                on_ready(ready)
                announced = True
        time.sleep(LOOP_INTERVAL)


def stop_all(services: list[Service], grace: float = STOP_GRACE) -> None:
    """Stop every service: SIGTERM, up to `grace` seconds to finish, then SIGKILL the leftovers."""
    for service in services:
        service.terminate()
    leftovers_told: set[str] = set()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        alive = [service for service in services if service.alive()]
        if not alive:
            break
        for service in alive:
            # The leader is gone but left processes behind: they get SIGTERM too.
            if not service.running() and service.name not in leftovers_told:
                service.signal_group(signal.SIGTERM)
                leftovers_told.add(service.name)
        time.sleep(0.1)
    for service in services:
        if service.alive():
            log(f"{service.name} still running after {grace:g}s: SIGKILL to its process group")
        service.kill()  # also reaps the leader; does nothing to an empty group
        service.join_output()


def main() -> int:
    """Run the platform until Ctrl-C or SIGTERM; return the exit code."""
    stop = StopRequested()
    stop.install()
    env = child_environment()

    started_redis = False
    if not env.get("REDIS_URL"):
        already = embedded_redis.is_answering()
        url = embedded_redis.start()
        started_redis = not already
        log(f"embedded Redis {'started' if started_redis else 'already running'} at {url}")
        env["REDIS_URL"] = url

    services = build_services(env)
    try:
        demo_accounts = prepare_database(env)
        if stop:
            return 0
        host = reachable_host(env.get("HOST") or "127.0.0.1")
        ports = [(host, int(env.get("PORT") or 8000)), (host, int(env.get("FLOWER_PORT") or 5555))]
        supervise(services, stop, lambda ready: print_banner(env, demo_accounts, ready), ports)
    except SystemExit as exc:
        if stop:  # Ctrl-C reached migrate too; that is a stop, not a failure
            return 0
        if isinstance(exc.code, str):
            log(exc.code)
            return 1
        raise
    finally:
        stop_all(services)
        if started_redis:
            log("stopping the embedded Redis")
            embedded_redis.stop()
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
