"""The real thing for the waits: uvicorn serving the platform (the wake route and the simulated
service), a Celery worker and Celery beat, all on the test database and Redis.

The worker calls the simulated service at PUBLIC_URL and hands it wake URLs under PUBLIC_URL, so
PUBLIC_URL must be this test server. It is chosen when this file is collected and put in the
environment, before any test starts a process: every worker of the session (the shared one of
`tests/conftest.py` too) then agrees on it.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ManagedProcess, child_env, session_processes, wait_until

VENV_BIN = Path(sys.executable).parent
# How often beat looks for due waits here: backup marks of a second or two stay accurate.
DUE_INTERVAL = "0.25"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT = _free_port()
PUBLIC_URL = f"http://127.0.0.1:{PORT}"
os.environ["PUBLIC_URL"] = PUBLIC_URL


@pytest.fixture(scope="session")
def waits_server(django_db_setup, django_db_blocker):
    """uvicorn serving `taskplatform.asgi:application` at PUBLIC_URL."""
    argv = [str(VENV_BIN / "uvicorn"), "taskplatform.asgi:application", "--host", "127.0.0.1", "--port", str(PORT),
            "--lifespan", "off", "--log-level", "warning"]
    server = ManagedProcess("uvicorn", argv, child_env(PUBLIC_URL=PUBLIC_URL))

    def start() -> None:
        server.start()
        wait_until(_answers, timeout=30, interval=0.1, message=f"uvicorn at {PUBLIC_URL} did not answer")

    server.restart = start
    start()
    yield server
    server.stop()


def _answers() -> bool:
    try:
        return httpx.get(f"{PUBLIC_URL}/healthz", timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def waits_beat(django_db_setup, django_db_blocker, tmp_path_factory):
    """Celery beat, looking for due waits every DUE_INTERVAL seconds."""
    schedule = tmp_path_factory.mktemp("beat") / "schedule"
    argv = [str(VENV_BIN / "celery"), "-A", "taskplatform", "beat", "--loglevel", "INFO", "-s", str(schedule)]
    beat = ManagedProcess("beat", argv, child_env(PUBLIC_URL=PUBLIC_URL, WAITS_DUE_INTERVAL=DUE_INTERVAL),
                          ready_marker="beat: Starting")
    beat.start()
    session_processes.append(beat)  # stopped by `only_own_workers`, started again by `stack`
    yield beat
    beat.stop()


@pytest.fixture
def stack(worker, waits_server, waits_beat):
    """A worker, the server and beat, for a transactional test. Returns the worker (restartable)."""
    if waits_server.proc.poll() is not None:
        waits_server.restart()
    if waits_beat.proc.poll() is not None:
        waits_beat.start()
    return worker
