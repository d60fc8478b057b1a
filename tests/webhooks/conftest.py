"""A local HTTP receiver for webhook deliveries."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Receiver:
    url: str
    status: int = 200
    received: list[dict] = field(default_factory=list)


@pytest.fixture
def receiver():
    """An HTTP server on 127.0.0.1 that records every POST and answers `receiver.status`."""
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.received.append({"headers": dict(self.headers), "body": body, "path": self.path})
            self.send_response(state.status)
            self.end_headers()
            self.wfile.write(b"ok" if state.status < 300 else b"nope")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def other_api_factory(db):
    """Makes a client for a second user on demand."""
    from tests.api.conftest import client_for
    from tests.conftest import make_user

    return lambda: client_for(make_user("other"))
