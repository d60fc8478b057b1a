"""Local HTTP(S) receivers for webhook deliveries."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Receiver:
    url: str
    port: int = 0
    status: int = 200
    # Answer with `Location: location` (and `status`, say 302) to test redirects.
    location: str | None = None
    received: list[dict] = field(default_factory=list)
    # The TLS server names (SNI) clients sent, for an https receiver.
    server_names: list[str | None] = field(default_factory=list)


@contextmanager
def receiver_running(*, ssl_context: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    """An HTTP (or, with `ssl_context`, HTTPS) server on 127.0.0.1 that records every POST and
    answers `receiver.status`."""
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.received.append({"headers": dict(self.headers), "body": body, "path": self.path})
            self.send_response(state.status)
            if state.location:
                self.send_header("Location", state.location)
            self.end_headers()
            self.wfile.write(b"ok" if state.status < 300 else b"nope")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if ssl_context is not None:
        ssl_context.sni_callback = lambda sock, name, ctx: state.server_names.append(name)
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    state.port = server.server_address[1]
    state.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{state.port}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver(settings):
    """A receiver on 127.0.0.1, and WEBHOOKS_ALLOW_PRIVATE_NETWORKS on for the test, as in an
    on-premise deployment: the default policy refuses loopback addresses (see test_ssrf.py)."""
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = True
    with receiver_running() as state:
        yield state


@pytest.fixture
def local_receiver():
    """A receiver on 127.0.0.1 under the default policy (so deliveries to it are refused)."""
    with receiver_running() as state:
        yield state


@pytest.fixture
def other_api_factory(db):
    """Makes a client for a second user on demand."""
    from tests.api.conftest import client_for
    from tests.conftest import make_user

    return lambda: client_for(make_user("other"))
