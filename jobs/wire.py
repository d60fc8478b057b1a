"""Writing to a live websocket without a round of awaits per connection.

A job watched by 1,000 sockets turns each event into 1,000 sends. Through ASGI every send is a
coroutine of its own (the consumer's, the middlewares', the server's), and a task per socket to
run it: about 0.1–0.2 ms per socket per event on this machine, so the last socket hears of an
event a fifth of a second after the first. Here the frame is built once per server process
(`text_frame`) and written to each socket's transport synchronously, in one loop, as
`websockets.broadcast` does.

That needs the server's connection object, which ASGI hides: `wire_for` finds it behind the
`send` callable the server handed to the application (kept in the scope by `RawSendInScope`,
since the session middleware wraps `send`). For uvicorn's `websockets-sansio` protocol (its
default when `websockets` is installed, as under `make run`) the frame goes straight to the
transport: server frames are not masked, and with permessage-deflate off (as `make run` serves)
every socket gets the same bytes; with deflate negotiated each socket compresses its own, still
without an await. Any other server (daphne, uvicorn's other protocols, channels' test
communicator) gets `AwaitedWire`: frames queue in order and one task per socket awaits `send`.

While the transport holds nothing for a socket (nearly always: a watcher reads what it is sent),
the frame goes to the socket with one `os.write`, as the transport itself would write it first:
uvloop's `write` around that call cost about 1 µs of the 13 µs per watcher of a pass
(bench/live_floor.py). What the kernel does not take at once (a full socket buffer) goes to the
transport, which then holds it and takes every later write, in order, as before.

A socket that cannot keep up is never waited for: when more than `LIVE_SLOW_CLIENT_BYTES` wait
in user space for it (its kernel buffers are full already: the socket's send buffer is bounded to
`LIVE_SOCKET_SEND_BUFFER`), it is closed with `SLOW` (4408), which tells the client to reconnect
with `?after=` its last seq; the event log has the rest. It is cut off if it has not read its
close frame `SLOW_CLOSE_TIMEOUT` seconds later.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import struct
from typing import Any, Protocol

from django.conf import settings

logger = logging.getLogger(__name__)

SCOPE_KEY = "taskplatform.server_send"
SLOW = 4408  # fell behind: reconnect with ?after=<the last seq you got>
SLOW_REASON = "too slow to read: reconnect with ?after=<the last seq you got>"
# Seconds a socket dropped as slow has to read what it was sent and its close frame.
SLOW_CLOSE_TIMEOUT = 30.0
# AwaitedWire: frames that may wait for one socket before it counts as slow.
AWAITED_BACKLOG = 1000


def text_frame(payload: bytes) -> bytes:
    """An unmasked, final text frame (RFC 6455, 5.2) carrying `payload`: what a server sends."""
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x81, length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", 0x81, 126, length)
    else:
        header = struct.pack("!BBQ", 0x81, 127, length)
    return header + payload


class Wire(Protocol):
    """One socket's way out, shared by its snapshot, its backlog and the live fan-out."""

    @property
    def open(self) -> bool:
        """False once closed (by either side) or dropped as slow."""

    def write(self, text: str, frame: bytes | None = None) -> bool:
        """Send `text` (`frame`: the same, already framed by `text_frame`) without waiting: the
        live path. False when the socket is closed, or was just dropped as slow."""

    def write_many(self, texts: list[str], frames: bytes | None = None) -> bool:
        """`write` for several messages at once (`frames`: theirs, joined), in one write."""

    async def send(self, text: str) -> bool:
        """Send `text` once the socket's buffer has room: the backlog's path, which a client
        reads at its own pace. A client that makes no room within SLOW_CLOSE_TIMEOUT is dropped
        as slow. False when the socket is closed or dropped."""

    async def drained(self) -> None:
        """Wait until the socket's buffer has room."""

    def close(self, code: int, reason: str = "") -> None:
        """Start the closing handshake with `code`, without waiting for anything."""


class RawSendInScope:
    """ASGI middleware: keeps the server's own `send` in the scope, for `wire_for`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket":
            scope = {**scope, SCOPE_KEY: send}
        return await self.app(scope, receive, send)


def _uvicorn_sansio_protocol(send: Any) -> Any:
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
    except ImportError:  # another server
        return None
    protocol = getattr(send, "__self__", None)
    return protocol if isinstance(protocol, WebSocketsSansIOProtocol) else None


def wire_for(scope: dict, send: Any) -> Wire:
    """The fastest wire the server allows for this socket (see the module docstring)."""
    protocol = _uvicorn_sansio_protocol(scope.get(SCOPE_KEY))
    if protocol is not None:
        return UvicornWire(protocol)
    return AwaitedWire(send)


def socket_send_buffer_bound(transport: Any) -> None:
    """Give the socket a send buffer of LIVE_SOCKET_SEND_BUFFER bytes instead of the kernel's
    autotuned one (up to 4 MB on Linux): a client that stops reading then shows as slow after
    a bounded amount, and holds that much kernel memory at most, not megabytes."""
    size = settings.LIVE_SOCKET_SEND_BUFFER
    sock = transport.get_extra_info("socket")
    if size and sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        except OSError as exc:  # not a TCP socket, or not allowed: the kernel's default stays
            logger.debug("could not bound the send buffer: %s", exc)


class UvicornWire:
    """Writes to uvicorn's websockets-sansio connection directly (its `send`, minus the await)."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.transport = protocol.transport
        # Without an extension (permessage-deflate) every socket gets the same bytes.
        self.shared_frames = not protocol.conn.extensions
        self.limit = settings.LIVE_SLOW_CLIENT_BYTES
        sock = self.transport.get_extra_info("socket")
        self.fd: int | None = sock.fileno() if sock is not None else None
        socket_send_buffer_bound(self.transport)
        # uvicorn's `writable` (and its own sends) then wait at the same mark as the live path
        # drops at: above `limit` the transport pauses, below a quarter of it it resumes.
        self.transport.set_write_buffer_limits(high=self.limit)

    @property
    def open(self) -> bool:
        protocol = self.protocol
        return not (protocol.close_sent or protocol.disconnected or self.transport.is_closing())

    def write(self, text: str, frame: bytes | None = None) -> bool:
        return self.write_many([text], frame)

    def write_many(self, texts: list[str], frames: bytes | None = None) -> bool:
        # Checked right before the write, in the same step of the loop: a socket the transport
        # has closed (and whose descriptor may be reused) is never written to directly.
        if not self.open:
            return False
        transport = self.transport
        held = transport.get_write_buffer_size()
        if held > self.limit:
            self.close(SLOW, SLOW_REASON)
            return False
        if frames is None or not self.shared_frames:
            connection = self.protocol.conn
            for text in texts:
                connection.send_text(text.encode())
            frames = b"".join(connection.data_to_send())
        if held or self.fd is None:
            transport.write(frames)
            return True
        try:
            written = os.write(self.fd, frames)
        except OSError:  # a full buffer; or reset, broken pipe: the transport meets it, and closes
            written = 0
        if written < len(frames):
            transport.write(frames[written:])
        return True

    async def send(self, text: str) -> bool:
        if not self.open:
            return False
        if not self.protocol.writable.is_set():
            try:
                await asyncio.wait_for(self.drained(), SLOW_CLOSE_TIMEOUT)
            except TimeoutError:
                self.close(SLOW, SLOW_REASON)
                return False
            if not self.open:
                return False
        connection = self.protocol.conn
        connection.send_text(text.encode())
        self.transport.write(b"".join(connection.data_to_send()))
        return True

    async def drained(self) -> None:
        # uvicorn's own flag: cleared while the transport's buffer is above its high-water mark.
        await self.protocol.writable.wait()

    def close(self, code: int, reason: str = "") -> None:
        protocol = self.protocol
        if protocol.close_sent or protocol.disconnected:
            return
        # What uvicorn does for an ASGI `websocket.close`, without first waiting for room.
        protocol.conn.send_close(code, reason)
        self.transport.write(b"".join(protocol.conn.data_to_send()))
        protocol.close_sent = True
        protocol.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        if protocol.read_paused:
            protocol.read_paused = False
            self.transport.resume_reading()
        # The peer's answer completes the close (uvicorn then cancels this timer); a peer that
        # reads nothing more is cut off, its unread frames dropped.
        timeout = SLOW_CLOSE_TIMEOUT if code == SLOW else protocol.close_timeout
        protocol.close_timer = protocol.loop.call_later(timeout, self.transport.abort)

    def stop(self) -> None:
        """Nothing to stop: the server owns the connection."""


class AwaitedWire:
    """For servers without a known connection object: frames queue in order and one task per
    socket awaits the ASGI `send` for each. More than AWAITED_BACKLOG waiting: slow."""

    def __init__(self, send: Any) -> None:
        self.asgi_send = send
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.closing = False
        self.failed = False
        self.more = asyncio.Event()
        self.empty = asyncio.Event()
        self.empty.set()
        self.task = asyncio.ensure_future(self._pump())

    @property
    def open(self) -> bool:
        return not (self.closing or self.failed)

    def write(self, text: str, frame: bytes | None = None) -> bool:
        if not self.open:
            return False
        if len(self.queue) >= AWAITED_BACKLOG:
            self.close(SLOW, SLOW_REASON)
            return False
        self._put({"type": "websocket.send", "text": text})
        return True

    def write_many(self, texts: list[str], frames: bytes | None = None) -> bool:
        return all(self.write(text) for text in texts)

    async def send(self, text: str) -> bool:
        if self.open and len(self.queue) >= AWAITED_BACKLOG // 2:
            try:
                await asyncio.wait_for(self.drained(), SLOW_CLOSE_TIMEOUT)
            except TimeoutError:
                self.close(SLOW, SLOW_REASON)
        if not self.open:
            return False
        self._put({"type": "websocket.send", "text": text})
        return True

    async def drained(self) -> None:
        await self.empty.wait()

    def close(self, code: int, reason: str = "") -> None:
        if self.closing or self.failed:
            return
        self.closing = True
        self.queue.clear()  # a slow socket gets its close at once, not after its backlog
        self._put({"type": "websocket.close", "code": code, "reason": reason})

    def _put(self, message: dict[str, Any]) -> None:
        self.queue.append(message)
        self.empty.clear()
        self.more.set()

    async def _pump(self) -> None:
        while True:
            await self.more.wait()
            self.more.clear()
            while self.queue:
                message = self.queue.popleft()
                try:
                    await self.asgi_send(message)
                except Exception as exc:  # the socket went away
                    logger.debug("websocket send failed: %s: %s", type(exc).__name__, exc)
                    self.failed = True
                    self.queue.clear()
                if message["type"] == "websocket.close" or self.failed:
                    self.empty.set()
                    return
            self.empty.set()

    def stop(self) -> None:
        """Stop the pump task (the consumer is done with the socket)."""
        self.task.cancel()
