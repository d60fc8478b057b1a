"""Fixtures for the live-progress tests: a real ASGI server, sessions and tokens for clients."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.test import Client

from accounts.services import api_token_create
from tests.support.processes import ManagedProcess, child_env, wait_until

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def asgi_server(*, port: int | None = None, workers: int = 1, log_level: str = "warning",
                env: dict[str, str] | None = None) -> ManagedProcess:
    """uvicorn serving `taskplatform.asgi:application` on the test database and Redis, with the
    options `make run` gives it (`log_level` "info" writes its access log too)."""
    port = port or free_port()
    argv = [
        str(VENV_BIN / "uvicorn"), "taskplatform.asgi:application", "--host", "127.0.0.1", "--port", str(port),
        "--lifespan", "off", "--ws-per-message-deflate", "false", "--workers", str(workers),
        "--log-level", log_level,
    ]
    process = ManagedProcess("uvicorn", argv, child_env(**(env or {})))
    process.url = f"http://127.0.0.1:{port}"
    return process


def wait_until_serving(url: str, timeout: float = 30.0) -> None:
    def answers() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    wait_until(answers, timeout=timeout, interval=0.1, message=f"the ASGI server at {url} did not answer")


@pytest.fixture(scope="session")
def live_asgi(django_db_setup, django_db_blocker):
    """One uvicorn process for the session."""
    server = asgi_server().start()
    wait_until_serving(server.url)
    yield server
    server.stop()


@pytest.fixture
def server(live_asgi, transactional_db) -> str:
    """The base URL of a running ASGI server for a test whose rows it must see."""
    if live_asgi.proc.poll() is not None:
        live_asgi.start()
        wait_until_serving(live_asgi.url)
    return live_asgi.url


def session_cookie(user) -> str:
    """A logged-in session for `user`, as the value of a Cookie header."""
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def token_for(user) -> str:
    return api_token_create(user=user, name="test")[1]


def ticket_for(user) -> str:
    """A websocket ticket for `user`, standing for a new API token of theirs (as
    `POST /api/ws-tickets/` would give its caller)."""
    from accounts.tickets import ws_ticket_issue

    token = api_token_create(user=user, name="test")[0]
    return ws_ticket_issue(user=user, credential=("token", str(token.pk)))[0]


def ticket_from(server: str, key: str) -> str:
    """A websocket ticket from a running server's `POST /api/ws-tickets/`, with API key `key`."""
    response = httpx.post(f"{server}/api/ws-tickets/", headers={"Authorization": f"Token {key}"}, timeout=10)
    assert response.status_code == 201, response.text
    return response.json()["ticket"]
