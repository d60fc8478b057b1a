"""Real processes for end-to-end tests: a Celery worker (and later servers) against the test
database and the test Redis, started as a deployment would start them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection

BASE_DIR = Path(settings.BASE_DIR)
VENV_BIN = Path(sys.executable).parent


def test_database_url() -> str:
    """The URL of the database the tests use (pytest-django's test database)."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process that must see exactly what the tests see."""
    env = dict(os.environ)
    # Importing taskplatform.asgi (the consumer tests do) turns the web server's connection pool
    # on in THIS process's environment; a worker must not inherit it (a pool that waits 10 s for a
    # connection while the database restarts would stall the worker). A server sets it itself.
    env.pop("DATABASE_POOL", None)
    env.update(
        DJANGO_SETTINGS_MODULE="taskplatform.settings.test",
        DATABASE_URL=test_database_url(),
        REDIS_URL=settings.REDIS_URL,
        REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class ManagedProcess:
    """A child process in its own process group, its output collected for assertions."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], ready_marker: str | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = cwd or BASE_DIR
        self.ready_marker = ready_marker
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._pumping: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> ManagedProcess:
        self.lines = []
        self._ready.clear()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: a stop reaches the pool's children too
        )
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()
        if self.ready_marker:
            self.wait_for_output(self.ready_marker, timeout=timeout)
        return self

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if os.environ.get("TEST_SHOW_PROCESS_OUTPUT"):
                sys.stderr.write(f"[{self.name}] {line}")

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_output(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in list(self.lines)):
                return
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}) before {text!r}:\n{self.output[-4000:]}"
                )
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not print {text!r} within {timeout}s:\n{self.output[-4000:]}")

    def signal(self, signum: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the whole group, then SIGKILL what is left after `timeout`."""
        if not self.proc:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reap_group()

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash)."""
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait(timeout=10)
        self._reap_group()

    def _reap_group(self) -> None:
        if not self.proc:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # Every line it wrote read before a test looks at `lines` (the pipe ends once the group is gone).
        if self._pumping is not None:
            self._pumping.join(timeout=5)


# The session's processes that run or send messages: its worker (tests/conftest.py), and beat
# where a package's tests start one (tests/waits). `only_own_workers` stops them.
session_processes: list[ManagedProcess] = []


def celery_worker(*, concurrency: int = 2, queues: str | None = None, extra_args: list[str] | None = None,
                  env: dict[str, str] | None = None, name: str = "worker") -> ManagedProcess:
    argv = [
        str(VENV_BIN / "celery"), "-A", "taskplatform", "worker",
        "--loglevel", "INFO", "--concurrency", str(concurrency), "--pool", "prefork",
        "--without-mingle", "--without-gossip", "--hostname", f"{name}-{os.getpid()}@%h",
    ]
    if queues:
        argv += ["--queues", queues]
    argv += extra_args or []
    return ManagedProcess(name, argv, child_env(**(env or {})), ready_marker=" ready.")


def celery_beat(*, env: dict[str, str] | None = None, name: str = "beat",
                schedule_file: str | None = None) -> ManagedProcess:
    """Celery beat as `make run` starts it. Its scheduler (ops.scheduler) writes no schedule file:
    `schedule_file` is accepted for older callers and ignored."""
    argv = [str(VENV_BIN / "celery"), "-A", "taskplatform", "beat", "--loglevel", "INFO"]
    return ManagedProcess(name, argv, child_env(**(env or {})), ready_marker="beat: Starting")


def wait_until(
    predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, message: str = ""
) -> object:
    """Poll `predicate` until it returns something truthy; fail with `message` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(message or f"condition not met within {timeout}s")
