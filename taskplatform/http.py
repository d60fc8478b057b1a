"""Plain HTTP requests through Django's WSGI handler in a pool of threads, inside the ASGI server.

Under Django's ASGI handler every sync middleware and the sync view each cross between the event
loop and a thread, both ways: about a dozen hand-offs for one API request, which cost more CPU
than the view itself (bench/README.md, "The shipped configuration"). Every view here is sync but
the Server-Sent Events stream, so a request whose view is not a coroutine runs through the WSGI
handler instead: the whole request (middleware, view, the response's iteration and `close()`,
which returns the database connection) in one thread, one hand-off each way. Async views (the
SSE stream) keep Django's ASGI handler, and websockets Channels.

The body is read before the thread starts (REQUEST_BODY_MAX_BYTES bounds it, see asgi.py) and the
response is collected in the thread, then sent: no view here streams but the async one.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import tempfile
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

from asgiref.sync import iscoroutinefunction
from asgiref.wsgi import WsgiToAsgiInstance
from django.urls import Resolver404, get_resolver

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


@lru_cache(maxsize=4096)
def path_is_async(path: str) -> bool:
    """Whether the view of `path` is a coroutine function (it must run on the event loop)."""
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)


class ThreadedWSGI:
    """An ASGI app that runs `wsgi_app` for each HTTP request in one of `threads` threads."""

    def __init__(self, wsgi_app: Callable, threads: int) -> None:
        self.wsgi_app = wsgi_app
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    @property
    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None or self._pid != os.getpid():  # a new one after a fork
            self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="http")
            self._pid = os.getpid()
        return self._executor

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        body = tempfile.SpooledTemporaryFile(max_size=65536)
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body.write(message.get("body", b""))
                if not message.get("more_body"):
                    break
            body.seek(0)
            context = contextvars.copy_context()
            status, headers, chunks = await asyncio.get_running_loop().run_in_executor(
                self.executor, context.run, self._run, scope, body)
        finally:
            body.close()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"".join(chunks)})

    def _run(self, scope: Scope, body: Any) -> tuple[int, list[tuple[bytes, bytes]], list[bytes]]:
        """In a thread: the whole WSGI request, its response iterated and closed."""
        adapter = WsgiToAsgiInstance(self.wsgi_app)
        adapter.scope = scope
        environ = adapter.build_environ(scope, body)
        started: dict[str, Any] = {}

        def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            started["status"] = int(status.split(" ", 1)[0])
            started["headers"] = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                                  for name, value in response_headers]

        response = self.wsgi_app(environ, start_response)
        try:
            chunks = [bytes(chunk) for chunk in response]
        finally:
            close = getattr(response, "close", None)
            if close is not None:
                close()  # request_finished: the database connection goes back
        return started["status"], started["headers"], chunks


def http_router(sync_app: ASGIApp, async_app: ASGIApp) -> ASGIApp:
    """HTTP to `async_app` when the path's view is a coroutine function, else to `sync_app`."""

    async def route(scope: Scope, receive: Callable, send: Callable) -> None:
        app = async_app if path_is_async(scope.get("path", "")) else sync_app
        await app(scope, receive, send)

    return route
