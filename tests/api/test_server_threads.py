"""Plain HTTP requests run through Django's WSGI handler in the server's threads
(taskplatform/http.py), one hand-off from the event loop each; the SSE stream, an async view,
keeps Django's ASGI handler."""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from accounts.services import api_token_create
from jobs.models import Job
from taskplatform.http import ThreadedWSGI, path_is_async
from tests.api.conftest import api_server_running
from tests.conftest import make_user


def test_only_the_async_views_keep_djangos_asgi_handler():
    job_id = uuid.uuid4()
    assert path_is_async(f"/api/jobs/{job_id}/events/stream/")
    assert not path_is_async("/api/jobs/")
    assert not path_is_async(f"/api/jobs/{job_id}/")
    assert not path_is_async("/admin/")
    assert not path_is_async("/no/such/page/")


def test_the_response_is_closed_in_the_thread_that_ran_the_request():
    """WSGI's `close()` is what sends Django's request_finished (the database connection goes back
    to the pool, the log context ends): it must be called, in the request's own thread."""
    seen: dict[str, object] = {}

    class Body(list):
        def close(self) -> None:
            seen["closed in"] = threading.current_thread().name

    def wsgi_app(environ, start_response):
        seen["ran in"] = threading.current_thread().name
        seen["body"] = environ["wsgi.input"].read()
        start_response("201 Created", [("Content-Type", "text/plain"), ("X-Seen", environ["PATH_INFO"])])
        return Body([b"made ", b"it"])

    async def call() -> list[dict]:
        app = ThreadedWSGI(wsgi_app, threads=2)
        incoming = [{"type": "http.request", "body": b"part one, ", "more_body": True},
                    {"type": "http.request", "body": b"part two"}]
        sent: list[dict] = []

        async def receive() -> dict:
            return incoming.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": "/x/", "raw_path": b"/x/",
                 "root_path": "", "query_string": b"", "headers": [], "server": ("testserver", 80),
                 "client": ("127.0.0.1", 5)}
        await app(scope, receive, send)
        return sent

    start, body = asyncio.run(call())
    assert start["status"] == 201 and (b"x-seen", b"/x/") in start["headers"]
    assert body["body"] == b"made it"
    assert seen["body"] == b"part one, part two"
    assert seen["ran in"].startswith("http") and seen["closed in"] == seen["ran in"]


@pytest.mark.django_db(transaction=True)
def test_a_pool_smaller_than_the_threads_serves_concurrent_requests_and_the_stream(dispatched):
    """Six threads, twelve clients, a pool of two connections; then the SSE stream on the same
    server."""
    _, key = api_token_create(user=make_user("poster"))
    headers = {"Authorization": f"Token {key}"}
    with api_server_running(WEB_THREADS="6", DATABASE_POOL_MIN="1", DATABASE_POOL_MAX="2",
                            API_THROTTLE_RATE="100000/min") as url:

        def submit(i: int) -> int:
            body = {"kind": "demo.noop", "input": {}, "idempotency_key": f"k{i}"}
            return httpx.post(f"{url}/api/jobs/", json=body, headers=headers, timeout=30).status_code

        with ThreadPoolExecutor(12) as pool:
            statuses = list(pool.map(submit, range(60)))
        # A sync page and the async stream, on the same server.
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        job = Job.objects.first()
        with httpx.stream("GET", f"{url}/api/jobs/{job.pk}/events/stream/", headers=headers, timeout=10) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            first = next(stream.iter_lines())
    assert statuses == [201] * 60
    assert Job.objects.count() == 60
    assert first.startswith(("id:", "retry:", ":", "event:", "data:"))
