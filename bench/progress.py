"""Live-progress bench: websocket clients follow jobs; emit-to-receive latency and delivery.

    python bench/progress.py [--cases spread one-job feed] [--watchers 1 200 1000]
                             [--feed-clients 1000] [--clients 100 1000] [--server-workers N ...]
                             [--client-procs 2]

The web server and the Celery worker run with the very command lines `make run` starts
(`devtools.supervisor.build_services`), against DATABASE_URL and REDIS_URL (PostgreSQL and
Redis for the figures in the README); the web processes are as many as `make run` starts
(`WEB_CONCURRENCY`, else one per core, at most 4), and `--server-workers N ...` runs the cases
again with N of them. The clients are websocket clients of their own, in
`--client-procs` processes apart from the server. Each socket connects as an API client does:
it asks `POST /api/ws-tickets/` for a ticket with the API token of one of the bench's staff
users (20 sockets per user, under the per-user cap of live streams), then connects with
`?ticket=` (an API key never goes in a URL).

Cases:

- `one-job`: W watchers (`--watchers`) on `/ws/jobs/{id}/` of ONE `demo.sleep` job
  (`{"seconds": 30, "steps": 60}`: about 6 events a second) that a real Celery worker runs. The
  job is submitted held back, every watcher connects, then it is dispatched.
- `feed`: F clients (`--feed-clients`) on `/ws/jobs/` while `demo.noop` jobs are submitted every
  `--feed-every` seconds for `--feed-seconds` (three status changes each: about 5 a second).
- `spread`: N clients (`--clients`) spread over `--jobs` jobs that this process drives through
  `JobContext.progress` (every `--period` s, `--events` times), as a worker would.

Latency is the client's receipt time minus the event's `created_at` (the feed: the job's
`updated_at`), both taken on this machine's clock. The row's time is taken as it is written,
before its commit, so the latency includes the durable write. A client takes the receipt time
when it reads the bytes, and parses them later (websockets' sans-I/O protocol on an asyncio
transport, parsed every 50 ms), so that the figure is the server's and not the clients'
parsing. Each read also carries the kernel's receive time (SO_TIMESTAMPNS through recvmsg): the
"at the socket" columns are from it, the moment the frame reached the client's host, before the
client process was scheduled to read it; on this 2-core machine the clients share the cores with
the server, and a client process reading 500 sockets reaches the last one late. Every client
checks its `seq`s for gaps and duplicates; delivery is counted against the rows in the database.

It prints a table and rewrites `bench/results/progress-latest.md` (and a JSON file per run).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script (`python bench/progress.py`)
    sys.path.insert(0, str(BASE_DIR))

RESULTS_DIR = BASE_DIR / "bench" / "results"
RESULTS = RESULTS_DIR / "progress-latest.md"
BENCH_SQLITE = BASE_DIR / "var" / "bench-progress.sqlite3"
LOG_DIR = BASE_DIR / "var" / "bench-progress"
AIM_P99_MS = 25.0
SOCKETS_PER_USER = 20  # below the per-user cap of live streams (LIVE_STREAMS_PER_USER)
SLEEP_INPUT = {"seconds": 30, "steps": 60}
PARSE_INTERVAL = 0.05  # seconds between two parses of what the client processes read
# Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS; the socket module does not name them): the kernel
# stamps each received segment, and recvmsg hands the stamp over with the bytes.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


class BenchError(RuntimeError):
    pass


# --- The clients (a process of their own: `--client-proc`) --------------------------------------


class Watcher(asyncio.Protocol):
    """One websocket client on websockets' sans-I/O protocol: it keeps (receipt time, frame).

    Once `deferred` (after the connections are made), `data_received` only notes the time and
    keeps the bytes; `parse` (every PARSE_INTERVAL, and at the end) makes frames of them, each
    with the time of the read that completed it, and answers pings. So a client process reading
    500 sockets does not delay its own later reads by parsing the earlier ones.
    """

    def __init__(self, uri: str, loop: asyncio.AbstractEventLoop) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        self.ws = ClientProtocol(parse_uri(uri), max_size=None)
        self.request = self.ws.connect()
        self.opened = loop.create_future()  # the handshake answered: the feed follows from then on
        self.first_frame = loop.create_future()  # a job stream's snapshot
        self.frames: list[tuple[tuple[float, float], bytes]] = []  # ((kernel time, read time), frame)
        self.close_code: int | None = None
        self.transport: asyncio.Transport | None = None
        self.deferred = False
        self.unparsed: list[tuple[tuple[float, float], bytes]] = []
        self.raw: socket.socket | None = None
        self.split_frames: bool | None = None  # `_split` the frames (decided at the first deferred parse)
        self.rest = b""  # the start of a frame `_split` has not had whole yet
        self.fragments: list[bytes] = []  # a fragmented message's parts so far

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.ws.send_request(self.request)
        self._flush()

    def data_received(self, data: bytes) -> None:
        now = time.time()  # before any parsing: the figure is the server's, not this client's
        if self.deferred:
            self.unparsed.append(((now, now), data))
        else:
            self._parse((now, now), data)

    def read_with_kernel_times(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on read the socket with recvmsg, keeping the kernel's receive time of each
        read beside the time this process got to it. On one machine whose two cores the clients
        share with the server, a client process reading 500 sockets reaches the last of them
        milliseconds after its bytes arrived: the kernel's time is when the server's frame
        reached the client's host, which is what a client on another host would see (less the
        network)."""
        assert self.transport is not None
        fd = self.transport.get_extra_info("socket").fileno()
        self.raw = socket.socket(fileno=os.dup(fd))  # the same socket, a descriptor of our own
        self.raw.setblocking(False)
        self.raw.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.transport.pause_reading()
        loop.add_reader(self.raw.fileno(), self._raw_ready, loop)

    def _raw_ready(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            data, ancillary, _, _ = self.raw.recvmsg(262144, socket.CMSG_SPACE(16))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancillary = b"", []
        now = time.time()
        if not data:
            loop.remove_reader(self.raw.fileno())
            return
        kernel = now
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                seconds, nanoseconds = struct.unpack("qq", payload[:16])
                kernel = seconds + nanoseconds / 1e9
        self.unparsed.append(((kernel, now), data))

    def parse(self) -> None:
        unparsed, self.unparsed = self.unparsed, []
        if self.split_frames is None and self.deferred:
            # From here on the frames are cut out of the bytes directly (`_split`): websockets'
            # parser cost this process three times the server's CPU per message, on the cores the
            # server's pass needs. Only at a frame boundary (nothing of a frame held back).
            self.split_frames = not self.ws.reader.buffer
        for now, data in unparsed:
            if self.split_frames:
                self._split(now, data)
            else:
                self._parse(now, data)

    def _split(self, now: tuple[float, float], data: bytes) -> None:
        """The server's frames (unmasked, RFC 6455 §5.2) cut out of `data`: text frames kept
        whole, a fragmented message joined, pings answered, a close noted."""
        from websockets.frames import Frame, Opcode

        buffer = self.rest + data if self.rest else data
        at, end = 0, len(buffer)
        while end - at >= 2:
            first, length = buffer[at], buffer[at + 1] & 0x7F
            head = 2
            if length == 126:
                if end - at < 4:
                    break
                length, head = int.from_bytes(buffer[at + 2 : at + 4], "big"), 4
            elif length == 127:
                if end - at < 10:
                    break
                length, head = int.from_bytes(buffer[at + 2 : at + 10], "big"), 10
            if end - at < head + length:
                break
            payload = buffer[at + head : at + head + length]
            at += head + length
            opcode, final = first & 0x0F, first & 0x80
            if opcode in (0x1, 0x0):  # text, or a continuation of one
                self.fragments.append(payload)
                if final:
                    self.frames.append((now, b"".join(self.fragments)))
                    self.fragments = []
            elif opcode == 0x9 and self.transport is not None:  # ping: the server closes a silent client
                self.transport.write(Frame(Opcode.PONG, payload).serialize(mask=True))
            elif opcode == 0x8:
                self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                if self.transport is not None:
                    self.transport.close()
        self.rest = buffer[at:]

    def _parse(self, now: tuple[float, float], data: bytes) -> None:
        from websockets.frames import Opcode
        from websockets.http11 import Response

        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Response):
                for future in (self.opened, self.first_frame):
                    if event.status_code != 101 and not future.done():
                        future.set_exception(BenchError(f"handshake answered {event.status_code}"))
                if event.status_code == 101 and not self.opened.done():
                    self.opened.set_result(None)
            elif event.opcode is Opcode.TEXT:
                self.frames.append((now, bytes(event.data)))
                if not self.first_frame.done():
                    self.first_frame.set_result(None)
            elif event.opcode is Opcode.CLOSE and self.ws.close_rcvd is not None:
                self.close_code = self.ws.close_rcvd.code
                if not self.first_frame.done():
                    self.first_frame.set_exception(BenchError(f"closed with {self.close_code}"))
        self._flush()

    def _flush(self) -> None:
        assert self.transport is not None
        for chunk in self.ws.data_to_send():
            if chunk:
                self.transport.write(chunk)
        if self.ws.close_expected():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.opened, self.first_frame):
            if not future.done():
                future.set_exception(BenchError(f"connection lost: {exc}"))


async def client_run(url: str, sockets: list[tuple[str, str]], connect_batch: int = 50) -> dict[str, Any]:
    """Open one socket per (path, API key), each with a ticket of its own, say `ready`, record
    until `stop` comes on stdin."""
    import httpx

    parts = urlsplit(url)
    loop = asyncio.get_running_loop()
    watchers: list[tuple[str, Watcher]] = []
    api = httpx.AsyncClient(base_url=url.replace("ws://", "http://", 1), timeout=60,
                            limits=httpx.Limits(max_connections=connect_batch))

    async def ticket_query(key: str) -> str:
        """`?ticket=…` for a socket of the user whose API key is `key`; none without a key (the
        floor's relay, `bench/live_relay.py`: no ticket, no account)."""
        if not key:
            return ""
        for attempt in range(3):
            try:
                answer = await api.post("/api/ws-tickets/", headers={"Authorization": f"Token {key}"})
                break
            except httpx.TransportError:  # a kept-alive connection the server closed meanwhile
                if attempt == 2:
                    raise
        if answer.status_code != 201:
            raise BenchError(f"no ticket: {answer.status_code} {answer.text[:200]}")
        return f"?ticket={answer.json()['ticket']}"

    async def open_one(path: str, key: str) -> tuple[str, Watcher]:
        query = await ticket_query(key)
        _, watcher = await loop.create_connection(
            lambda: Watcher(f"{url}{path}{query}", loop), parts.hostname, parts.port
        )
        await asyncio.wait_for(watcher.opened, 60)
        if path != FEED_PATH:  # a job's stream starts with its snapshot; the feed says nothing
            await asyncio.wait_for(watcher.first_frame, 60)
        return path, watcher

    async with api:
        for start in range(0, len(sockets), connect_batch):
            watchers += await asyncio.gather(*(open_one(*pair) for pair in sockets[start : start + connect_batch]))
    for _, watcher in watchers:
        watcher.deferred = True
        watcher.read_with_kernel_times(loop)

    async def parse_now_and_then() -> None:
        while True:
            await asyncio.sleep(PARSE_INTERVAL)
            for _, watcher in watchers:
                watcher.parse()

    parsing = asyncio.ensure_future(parse_now_and_then())
    print("ready", flush=True)
    cpu = time.process_time()
    await loop.run_in_executor(None, sys.stdin.readline)  # the bench says when the events are over
    parsing.cancel()
    cpu = time.process_time() - cpu  # reading the events as they came (what follows is the tally)
    result: dict[str, Any] = {"latencies_ms": [], "kernel_latencies_ms": [], "arrivals": [], "received": 0,
                              "gaps": 0, "duplicates": 0, "snapshots": [], "close_codes": []}
    for path, watcher in watchers:
        watcher.parse()
        if watcher.raw is not None:
            loop.remove_reader(watcher.raw.fileno())
            watcher.raw.close()
        if watcher.transport is not None:
            watcher.transport.abort()
        (feed_result if path == FEED_PATH else job_result)(path, watcher, result)
        if watcher.close_code is not None:
            result["close_codes"].append(watcher.close_code)
    result["cpu_seconds"] = cpu
    return result


FEED_PATH = "/ws/jobs/"


def _latency_ms(arrived: float, stamp: str) -> float:
    return round((arrived - datetime.fromisoformat(stamp).timestamp()) * 1000, 3)


def job_result(path: str, watcher: Watcher, result: dict[str, Any]) -> None:
    """Add one job socket's events to `result`: latencies, gaps, duplicates, its snapshot's seq."""
    last_seq = json.loads(watcher.frames[0][1])["last_seq"]  # the snapshot: live events follow it
    result["snapshots"].append([path, last_seq])
    for arrived, raw in watcher.frames[1:]:
        event = json.loads(raw)["event"]
        if event["seq"] <= last_seq:
            result["duplicates"] += 1
            continue
        if event["seq"] != last_seq + 1:
            result["gaps"] += 1
        last_seq = event["seq"]
        result["received"] += 1
        result["kernel_latencies_ms"].append(_latency_ms(arrived[0], event["created_at"]))
        result["latencies_ms"].append(_latency_ms(arrived[1], event["created_at"]))
        result["arrivals"].append([event["seq"], event["type"], result["kernel_latencies_ms"][-1]])


def by_event_type(arrivals: list[list[Any]]) -> dict[str, dict[str, float]]:
    """Where an event's time goes across its watchers, by the event's type: for each event, the
    latency at the socket of the first watcher to get it (the pipeline, and the burst window when
    it waited), the median one, and the last (the first plus one pass of the fan-out over every
    socket); the medians of those over the events of each type, and `events`, how many."""
    per_event: dict[int, tuple[str, list[float]]] = {}
    for seq, kind, ms in arrivals:
        per_event.setdefault(seq, (kind, []))[1].append(ms)
    by_type: dict[str, list[tuple[float, float, float]]] = {}
    for kind, values in per_event.values():
        values.sort()
        by_type.setdefault(kind, []).append((values[0], values[len(values) // 2], values[-1]))
    return {kind: {"events": len(rows), "first_ms": round(statistics.median(r[0] for r in rows), 1),
                   "median_ms": round(statistics.median(r[1] for r in rows), 1),
                   "last_ms": round(statistics.median(r[2] for r in rows), 1)}
            for kind, rows in sorted(by_type.items())}


def slowest_events(arrivals: list[list[Any]], count: int = 6) -> list[dict[str, Any]]:
    """The events that make the tail: the `count` with the latest median watcher, each with its
    seq, type, first, median and last latency at the socket, and its share of the deliveries
    past the run's p99 (at the socket)."""
    per_event: dict[int, tuple[str, list[float]]] = {}
    for seq, kind, ms in arrivals:
        per_event.setdefault(seq, (kind, []))[1].append(ms)
    everything = sorted(ms for _, _, ms in arrivals)
    p99 = everything[min(len(everything) - 1, int(0.99 * len(everything)))] if everything else 0.0
    tail = sum(1 for ms in everything if ms > p99) or 1
    rows = []
    for seq, (kind, values) in per_event.items():
        values.sort()
        rows.append({"seq": seq, "type": kind, "first_ms": round(values[0], 1),
                     "median_ms": round(values[len(values) // 2], 1), "last_ms": round(values[-1], 1),
                     "tail_share": round(sum(1 for ms in values if ms > p99) / tail, 3)})
    rows.sort(key=lambda row: row["median_ms"], reverse=True)
    return rows[:count]


def feed_result(path: str, watcher: Watcher, result: dict[str, Any]) -> None:
    """Add one feed socket's status changes to `result` (latency from the job's `updated_at`)."""
    seen = set()
    for arrived, raw in watcher.frames:
        job = json.loads(raw)["job"]
        key = (job["id"], job["status"], job["updated_at"])
        if key in seen:
            result["duplicates"] += 1
            continue
        seen.add(key)
        result["received"] += 1
        result["kernel_latencies_ms"].append(_latency_ms(arrived[0], job["updated_at"]))
        result["latencies_ms"].append(_latency_ms(arrived[1], job["updated_at"]))


def client_main(args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # plain asyncio: the client costs a little more per message
        pass
    sockets = [tuple(pair) for pair in json.loads(Path(args.sockets).read_text())]
    result = asyncio.run(client_run(args.url, sockets))
    Path(args.sockets).with_suffix(".result.json").write_text(json.dumps(result))
    print("done", flush=True)


class Clients:
    """Sockets (path, API key) spread over `procs` client processes; `ready()`, then `results()`.

    `nice` (`--client-nice`): the client processes' niceness. The clients of a real server are on
    other machines; here they share its two cores, and the kernel wakes a client process at every
    frame the server writes to it, which then competes with the server's loop for a core. A
    positive niceness gives the server (and the worker, PostgreSQL, Redis) the cores first: a
    stand-in for clients elsewhere, to tell the server's share of the latency from the clients'."""

    nice = 0

    def __init__(self, url: str, sockets: list[tuple[str, str]], procs: int) -> None:
        self.procs: list[subprocess.Popen] = []
        self.listings: list[Path] = []
        for part in range(procs):
            share = sockets[part::procs]
            if not share:
                continue
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            listing = LOG_DIR / f"client-{part}.json"
            listing.write_text(json.dumps(share))
            listing.with_suffix(".result.json").unlink(missing_ok=True)
            self.listings.append(listing)
            argv = [sys.executable, __file__, "--client-proc", "--url", url, "--sockets", str(listing)]
            proc = subprocess.Popen(argv, cwd=BASE_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    preexec_fn=functools.partial(os.nice, self.nice) if self.nice else None)
            self.procs.append(proc)

    def ready(self) -> None:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                self.kill()
                raise BenchError(f"a client process did not connect: {line!r}")

    def results(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for proc, listing in zip(self.procs, self.listings, strict=True):
            out, _ = proc.communicate("stop\n", timeout=300)
            if proc.returncode != 0 or "done" not in out:
                raise BenchError(f"a client process gave no result: {out[-2000:]!r}")
            for key, value in json.loads(listing.with_suffix(".result.json").read_text()).items():
                merged[key] = merged[key] + value if key in merged else value
        return merged

    def settled(self, server: Process, cpu: float) -> tuple[float, dict[str, Any]]:
        """Once the last events have had a second to reach the clients: the CPU `server`'s
        processes took since `cpu`, and the clients' `results()`."""
        time.sleep(1.0)
        return server.cpu_seconds() - cpu, self.results()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()


# --- The platform's processes, as `make run` starts them -----------------------------------------


def prepare_environment() -> str:
    """Point this process (and the processes it starts) at Redis and a database; return a label."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    os.environ["REDIS_KEY_PREFIX"] = f"bench-progress-{uuid.uuid4().hex[:8]}:"
    redis = "external Redis"
    if not os.environ.get("REDIS_URL"):
        from devtools import embedded_redis

        os.environ["REDIS_URL"] = embedded_redis.start()
        redis = "embedded Redis"
    database = "PostgreSQL" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    if database == "PostgreSQL":
        postgres_database_ensure(os.environ["DATABASE_URL"])
    if not os.environ.get("DATABASE_URL"):
        BENCH_SQLITE.parent.mkdir(parents=True, exist_ok=True)
        for leftover in BENCH_SQLITE.parent.glob(BENCH_SQLITE.name + "*"):
            leftover.unlink()
        os.environ["DATABASE_URL"] = f"sqlite:///{BENCH_SQLITE}"
    return f"{database}, {redis}"


def postgres_database_ensure(url: str) -> None:
    """Create the database that `url` names unless it exists."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    maintenance = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_cpu_seconds(pgid: int) -> float:
    """CPU time (user + system) of every process in process group `pgid` so far (Linux /proc)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that just ended
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def shipped(name: str, env: dict[str, str]) -> tuple[list[str], dict[str, str], int]:
    """The command line, environment and nice value `make run` starts the service `name` with
    (`web`, `worker`, ...): the worker, for one, runs without DEBUG, below the web's priority."""
    from devtools.supervisor import build_services

    return next((service.argv, service.env, service.nice) for service in build_services(env) if service.name == name)


class Process:
    """One of the platform's processes, started as `make run` starts it; output in var/."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], nice: int = 0) -> None:
        self.name, self.argv, self.env, self.nice = name, argv, env, nice
        self.proc: subprocess.Popen | None = None
        self.log = LOG_DIR / f"{name}.log"
        self.url = self.ws_url = ""  # a server's, once it listens

    def start(self) -> Process:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, cwd=BASE_DIR, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        if self.nice:  # as make run's supervisor does (devtools/priority.py)
            from devtools.priority import lower_priority

            lower_priority(self.proc.pid, self.nice)
        return self

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited:\n{self.log.read_text()[-3000:]}")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return group_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)


def web_server(env: dict[str, str], workers: int) -> Process:
    """uvicorn with `make run`'s command line on a free port, with `workers` web processes."""
    import httpx

    port = free_port()
    server = Process(f"web-x{workers}", *shipped("web", {**env, "PORT": str(port), "HOST": "127.0.0.1",
                                                         "WEB_CONCURRENCY": str(workers)})).start()
    server.url, server.ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        server.alive()
        try:
            if httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise BenchError("uvicorn did not answer within 60 s")


def celery_worker(env: dict[str, str]) -> Process:
    worker = Process("worker", *shipped("worker", env)).start()
    deadline = time.monotonic() + 60
    while " ready." not in worker.log.read_text(errors="replace"):
        worker.alive()
        if time.monotonic() > deadline:
            raise BenchError("the Celery worker did not get ready within 60 s")
        time.sleep(0.2)
    return worker


# --- The cases ---------------------------------------------------------------------------------


def api_keys(users: list[Any], count: int) -> list[str]:
    """`count` API keys, SOCKETS_PER_USER per user: a token per user, as an integration has."""
    from accounts.services import api_token_create

    keys = []
    for user in users[: max(1, -(-count // SOCKETS_PER_USER))]:
        keys += [api_token_create(user=user, name="bench")[1]] * SOCKETS_PER_USER
    return keys[:count]


def bench_users(count: int) -> list[Any]:
    from accounts.services import user_ensure

    return [user_ensure(username=f"bench-watcher-{n}", staff=True)[0] for n in range(count)]


def summary(case: str, workers: int, watchers: int, result: dict[str, Any], expected: int,
            events: int, seconds: float, cpu: float) -> dict[str, Any]:
    latencies = sorted(result["latencies_ms"])
    at_socket = sorted(result.get("kernel_latencies_ms", []))

    def quantile(q: float, values: list[float] = latencies) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    return {
        "case": case, "server_procs": workers, "watchers": watchers, "events": events,
        "events_per_s": events / max(seconds, 1e-9), "expected": expected, "received": result["received"],
        "delivery": result["received"] / expected if expected else 1.0, "gaps": result["gaps"],
        "duplicates": result["duplicates"], "closed": len(result["close_codes"]),
        "close_codes": sorted(set(result["close_codes"])),
        "p50_ms": quantile(0.50), "p99_ms": quantile(0.99), "max_ms": latencies[-1] if latencies else float("nan"),
        "socket_p50_ms": quantile(0.50, at_socket), "socket_p99_ms": quantile(0.99, at_socket),
        "mean_ms": statistics.fmean(latencies) if latencies else float("nan"),
        "server_cpu_us_per_message": cpu / max(result["received"], 1) * 1e6,
        "client_cpu_us_per_message": result.get("cpu_seconds", 0.0) / max(result["received"], 1) * 1e6,
    }


def expected_events(snapshots: list[list[Any]]) -> int:
    """Events each job socket should have had live: its job's last seq minus its snapshot's."""
    from jobs.models import Job

    totals = {f"/ws/jobs/{pk}/": seq for pk, seq in Job.objects.values_list("pk", "event_seq")
              .filter(pk__in={path.split("/")[3] for path, _ in snapshots})}
    return sum(totals[path] - seq for path, seq in snapshots)


def run_one_job(server: Process, workers: int, users: list[Any], watchers: int, procs: int) -> dict[str, Any]:
    """W watchers of one demo.sleep job run by the worker."""
    from unittest import mock

    from jobs.models import Job
    from jobs.services import job_dispatch, job_submit

    with mock.patch("jobs.services.transitions.job_dispatch"):  # held back until every watcher is there
        job, _ = job_submit(kind="demo.sleep", input=SLEEP_INPUT, owner=users[0])
    path = f"/ws/jobs/{job.pk}/"
    clients = Clients(server.ws_url, [(path, key) for key in api_keys(users, watchers)], procs)
    try:
        clients.ready()
        cpu, started = server.cpu_seconds(), time.monotonic()
        job_dispatch(job=job)
        deadline = started + SLEEP_INPUT["seconds"] + 120
        while not Job.objects.get(pk=job.pk).is_finished:
            if time.monotonic() > deadline:
                raise BenchError(f"job {job.pk} did not finish")
            time.sleep(0.25)
        seconds = time.monotonic() - started
        cpu, result = clients.settled(server, cpu)
    finally:
        clients.kill()
    events = Job.objects.get(pk=job.pk).event_seq - 1  # all but `pending`, written before the dispatch
    row = one_job_summary("one job", workers, watchers, result, expected_events(result["snapshots"]), events,
                          seconds, cpu)
    row["job_id"] = str(job.pk)
    return row


def one_job_summary(case: str, workers: int, watchers: int, result: dict[str, Any], expected: int, events: int,
                    seconds: float, cpu: float) -> dict[str, Any]:
    """`summary`, with where the events' time went, by type and for the slowest."""
    row = summary(case, workers, watchers, result, expected, events, seconds, cpu)
    row["by_event_type"] = by_event_type(result["arrivals"])
    row["slowest_events"] = slowest_events(result["arrivals"])
    return row


def event_schedule(job_id: str) -> list[tuple[float, dict[str, Any]]]:
    """The live events of a job the worker ran (all but `pending`, written before the dispatch):
    each one's offset in seconds from the first, and its JSON as the streams send it."""
    from jobs.models import JobEvent

    events = list(JobEvent.objects.filter(job_id=job_id, seq__gt=1).order_by("seq"))
    if not events:
        raise BenchError(f"job {job_id} has no events to replay")
    start = events[0].created_at
    return [((event.created_at - start).total_seconds(), event.as_dict()) for event in events]


def run_one_job_floor(env: dict[str, str], workers: int, watchers: int, procs: int,
                      schedule: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """The same watchers and the same events at the same moments, through the least a server does
    (`bench/live_relay.py`): each event written as a row (one INSERT, committed) and published on a
    Redis channel by this process, relayed by bare websockets processes to every socket."""
    import redis
    from django.db import connection

    channel = f"{os.environ['REDIS_KEY_PREFIX']}floor"
    first = schedule[0][1]["seq"]
    port = free_port()
    argv = [sys.executable, str(BASE_DIR / "bench" / "live_relay.py"), "--port", str(port), "--processes",
            str(workers), "--redis", os.environ["REDIS_URL"], "--channel", channel, "--last-seq", str(first - 1)]
    relay = Process(f"relay-x{workers}", argv, env).start()
    relay.ws_url = f"ws://127.0.0.1:{port}"
    publisher = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        deadline = time.monotonic() + 60
        while relay.log.read_text(errors="replace").count("listening") < workers:
            relay.alive()
            if time.monotonic() > deadline:
                raise BenchError("the floor's relay did not listen within 60 s")
            time.sleep(0.1)
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_live_floor "
                           "(seq integer NOT NULL, type varchar(16) NOT NULL, body text NOT NULL, "
                           "created_at varchar(40) NOT NULL)")
            cursor.execute("DELETE FROM bench_live_floor")
        clients = Clients(relay.ws_url, [("/ws/jobs/floor/", "")] * watchers, procs)
        try:
            clients.ready()
            cpu, started = relay.cpu_seconds(), time.monotonic()
            with connection.cursor() as cursor:
                for offset, event in schedule:
                    time.sleep(max(0.0, started + offset - time.monotonic()))
                    event = {**event, "created_at": datetime.now(UTC).isoformat()}  # as the row is written
                    text = json.dumps({"type": "event", "event": event})
                    cursor.execute("INSERT INTO bench_live_floor (seq, type, body, created_at) VALUES (%s, %s, %s, %s)",
                                   [event["seq"], event["type"], text, event["created_at"]])
                    publisher.publish(channel, text)  # autocommit: the row committed first
            seconds = time.monotonic() - started
            cpu, result = clients.settled(relay, cpu)
        finally:
            clients.kill()
    finally:
        publisher.close()
        relay.stop()
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_live_floor")
    expected = len(schedule) * len(result["snapshots"])
    if any(seq != first - 1 for _, seq in result["snapshots"]):
        raise BenchError("a floor socket's snapshot was not the relay's")
    return one_job_summary("one job, floor", workers, watchers, result, expected, len(schedule), seconds, cpu)


def run_feed(server: Process, workers: int, users: list[Any], watchers: int, procs: int, every: float,
             seconds: float) -> dict[str, Any]:
    """F clients of /ws/jobs/ while demo.noop jobs are submitted every `every` s."""
    from jobs.models import Job, JobEvent
    from jobs.services import job_submit

    clients = Clients(server.ws_url, [(FEED_PATH, key) for key in api_keys(users, watchers)], procs)
    try:
        clients.ready()  # each feed socket has joined the feed before its handshake was answered
        cpu, started = server.cpu_seconds(), time.monotonic()
        jobs = []
        for number in range(int(seconds / every)):
            time.sleep(max(0.0, started + number * every - time.monotonic()))
            jobs.append(job_submit(kind="demo.noop", input={}, owner=users[0])[0].pk)
        deadline = time.monotonic() + 60
        while Job.objects.filter(pk__in=jobs).exclude(status__in=Job.TERMINAL).exists():
            if time.monotonic() > deadline:
                raise BenchError("the feed's jobs did not finish")
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        cpu, result = clients.settled(server, cpu)
    finally:
        clients.kill()
    events = JobEvent.objects.filter(job_id__in=jobs, type=JobEvent.Type.STATUS).count()
    return summary("feed", workers, watchers, result, events * watchers, events, elapsed, cpu)


def run_spread(server: Process, workers: int, users: list[Any], clients_count: int, procs: int, *, jobs: int,
               events: int, period: float) -> dict[str, Any]:
    """N clients spread over `jobs` jobs (round robin) that this process drives, as a worker would."""
    from unittest import mock

    from jobs.broadcast import publisher
    from jobs.runtime import JobContext
    from jobs.services import job_claim, job_complete, job_submit

    with mock.patch("jobs.services.transitions.job_dispatch"):  # this process plays the worker
        contexts = [JobContext(job_claim(job_id=job_submit(kind="demo.noop", input={}, owner=users[0])[0].pk))
                    for _ in range(jobs)]
    keys = api_keys(users, clients_count)
    sockets = [(f"/ws/jobs/{contexts[index % jobs].job_id}/", key) for index, key in enumerate(keys)]
    clients = Clients(server.ws_url, sockets, procs)
    try:
        clients.ready()
        cpu, started = server.cpu_seconds(), time.monotonic()
        for round_number in range(1, events + 1):
            for index, ctx in enumerate(contexts):
                due = started + (round_number - 1) * period + index * period / jobs
                time.sleep(max(0.0, due - time.monotonic()))
                ctx.progress(round_number / events, f"{round_number} of {events}")
        elapsed = time.monotonic() - started
        for ctx in contexts:
            ctx.flush()
            job_complete(job=ctx.job, result={})
        publisher().flush(30)
        cpu, result = clients.settled(server, cpu)
    finally:
        clients.kill()
    return summary(f"{jobs} jobs", workers, clients_count, result, expected_events(result["snapshots"]),
                   events * jobs, elapsed, cpu)


def one_job_rounds(server: Process, env: dict[str, str], workers: int, users: list[Any], watchers: int,
                   args: argparse.Namespace) -> list[dict[str, Any]]:
    """The one-job case at `watchers`; with `--floor PAIRS`, alternating with its floor in the same
    minutes (platform, floor, floor, platform, ...), each floor run replaying the events of the
    platform's run before it."""
    rows = [run_one_job(server, workers, users, watchers, args.client_procs)]
    if not args.floor:
        return rows
    schedule = event_schedule(rows[0]["job_id"])
    for number in range(1, 2 * args.floor):
        if number % 4 in (0, 3):  # the platform's turn
            rows.append(run_one_job(server, workers, users, watchers, args.client_procs))
            schedule = event_schedule(rows[-1]["job_id"])
        else:
            rows.append(run_one_job_floor(env, workers, watchers, args.client_procs, schedule))
        print(f"  {rows[-1]['case']}: p99 {rows[-1]['p99_ms']:.1f} ms, at the socket "
              f"{rows[-1]['socket_p99_ms']:.1f}", flush=True)
    return rows


def floor_comparison(rows: list[dict[str, Any]]) -> str:
    """The platform's one-job runs beside their floor's, per web processes and watchers: p50 and
    p99 of each run, and the medians."""
    lines = []
    for key in sorted({(row["server_procs"], row["watchers"]) for row in rows if row["case"] == "one job, floor"}):
        same = [row for row in rows if (row["server_procs"], row["watchers"]) == key]
        for case in ("one job", "one job, floor"):
            runs = [row for row in same if row["case"] == case]
            each = ", ".join(f"{row['p99_ms']:.1f}" for row in runs)
            lines.append(
                f"{case:>15}, web x{key[0]}, {key[1]} watchers: p99 {each} ms (median "
                f"{statistics.median(row['p99_ms'] for row in runs):.1f}), at the socket "
                f"{statistics.median(row['socket_p99_ms'] for row in runs):.1f}; p50 "
                f"{statistics.median(row['p50_ms'] for row in runs):.1f}; server CPU "
                f"{statistics.median(row['server_cpu_us_per_message'] for row in runs):.1f} µs/msg"
            )
    return "\n".join(lines)


# --- Report ------------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | web procs | watchers | events/s | delivered | gaps | dups | closed "
        "| p50 ms | p99 ms | max ms | at the socket p50 / p99 ms | server CPU µs/msg | clients' CPU µs/msg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['case']} | {row['server_procs']} | {row['watchers']} | {row['events_per_s']:.1f} "
            f"| {row['received']}/{row['expected']} | {row['gaps']} | {row['duplicates']} | {row['closed']} "
            f"| {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['max_ms']:.1f} "
            f"| {row.get('socket_p50_ms', float('nan')):.1f} / {row.get('socket_p99_ms', float('nan')):.1f} "
            f"| {row['server_cpu_us_per_message']:.0f} | {row.get('client_cpu_us_per_message', float('nan')):.0f} |"
        )
    by_type = [row for row in rows if row.get("by_event_type")]
    if by_type:
        lines += [
            "",
            "One job, where an event's time goes, at the socket (medians over the events of each type): the first "
            "watcher to get it, the median one, the last.",
            "",
            "| case | web procs | watchers | event type | events | first ms | median ms | last ms |",
            "|---|---:|---:|---|---:|---:|---:|---:|",
        ]
        for row in by_type:
            for kind, figures in row["by_event_type"].items():
                lines.append(f"| {row['case']} | {row['server_procs']} | {row['watchers']} | {kind} "
                             f"| {figures['events']} | {figures['first_ms']:.1f} | {figures['median_ms']:.1f} "
                             f"| {figures['last_ms']:.1f} |")
        lines += [
            "",
            "One job, the slowest events (by their median watcher), at the socket, and each one's share of the "
            "deliveries past the p99.",
            "",
            "| case | web procs | watchers | seq | event type | first ms | median ms | last ms | share of the tail |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|",
        ]
        for row in by_type:
            for event in row.get("slowest_events", []):
                lines.append(f"| {row['case']} | {row['server_procs']} | {row['watchers']} | {event['seq']} "
                             f"| {event['type']} "
                             f"| {event['first_ms']:.1f} | {event['median_ms']:.1f} | {event['last_ms']:.1f} "
                             f"| {event['tail_share']:.0%} |")
    return "\n".join(lines)


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BASE_DIR, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=BASE_DIR, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" (with local changes)" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["one-job", "feed", "spread"],
                        choices=["one-job", "feed", "spread"])
    parser.add_argument("--watchers", type=int, nargs="+", default=[1, 200, 1000],
                        help="watchers of one job (one-job)")
    parser.add_argument("--feed-clients", type=int, nargs="+", default=[1000], help="clients of /ws/jobs/ (feed)")
    parser.add_argument("--feed-every", type=float, default=0.6, help="seconds between two feed jobs")
    parser.add_argument("--feed-seconds", type=float, default=30.0, help="how long jobs are submitted (feed)")
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000], help="clients (spread)")
    parser.add_argument("--jobs", type=int, default=10, help="jobs the clients are spread over (spread)")
    parser.add_argument("--events", type=int, default=20, help="progress reports per job (spread)")
    parser.add_argument("--period", type=float, default=0.5, help="seconds between two reports (spread, >= 0.1)")
    parser.add_argument("--server-workers", type=int, nargs="+", default=None,
                        help="web processes (default: as many as make run starts here)")
    parser.add_argument("--client-procs", type=int, default=2, help="processes the clients are spread over")
    parser.add_argument("--client-nice", type=int, default=0,
                        help="niceness of the client processes (e.g. 19: the server's processes get the cores "
                             "first, as with clients on other machines)")
    parser.add_argument("--floor", type=int, default=0, metavar="PAIRS",
                        help="one-job: also run the floor (bench/live_relay.py), alternating with the platform "
                             "PAIRS times each (platform, floor, floor, platform, ...)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/")
    parser.add_argument("--client-proc", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--sockets", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_proc:
        client_main(args)
        return
    if args.period < 0.1:
        parser.error("--period below 0.1 s: ctx.progress coalesces reports closer than 100 ms")

    Clients.nice = args.client_nice
    setup = prepare_environment()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from devtools.supervisor import child_environment, web_processes

    call_command("migrate", verbosity=0)
    env = child_environment()
    most = max([*args.watchers, *args.feed_clients, *args.clients])
    users = bench_users(-(-most // SOCKETS_PER_USER))
    load = os.getloadavg()
    rows = []
    worker = celery_worker(env) if {"one-job", "feed"} & set(args.cases) else None
    try:
        for workers in args.server_workers or [web_processes(env)]:
            server = web_server(env, workers)
            try:
                for case in args.cases:
                    if case == "one-job":
                        measured = []
                        for n in args.watchers:
                            measured += one_job_rounds(server, env, workers, users, n, args)
                    elif case == "feed":
                        measured = [run_feed(server, workers, users, n, args.client_procs, args.feed_every,
                                             args.feed_seconds) for n in args.feed_clients]
                    else:
                        measured = [run_spread(server, workers, users, n, args.client_procs, jobs=args.jobs,
                                               events=args.events, period=args.period) for n in args.clients]
                    for row in measured:
                        rows.append(row)
                        print(f"{row['case']}, web x{workers}, {row['watchers']} watchers: p50 {row['p50_ms']:.1f} ms, "
                              f"p99 {row['p99_ms']:.1f} ms, delivered {row['received']}/{row['expected']}", flush=True)
            finally:
                server.stop()
    finally:
        if worker is not None:
            worker.stop()

    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    header = (
        f"{setup}; web and worker with `make run`'s command lines and environments (the web's DEBUG "
        f"{settings.DEBUG}, the worker's off); clients in "
        f"{args.client_procs} process(es){f' at niceness {args.client_nice}' if args.client_nice else ''}, "
        f"{SOCKETS_PER_USER} sockets per user; {machine}; load average at start "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; commit {git_commit()}"
    )
    report = table(rows)
    compared = floor_comparison(rows)
    if compared:
        report += ("\n\nThe platform beside its floor (`bench/live_relay.py`), in the same minutes:"
                   f"\n\n```\n{compared}\n```")
    print(f"\n{header}\n{report}")
    judged = [row for row in rows if row["case"] == "one job" and row["watchers"] >= 1000]
    met = [row["p99_ms"] <= AIM_P99_MS and row["received"] == row["expected"] for row in judged]
    verdict = ("met" if all(met) else "NOT met") if judged else "not measured"
    print(f"\naim (one job, 1,000 watchers: p99 <= {AIM_P99_MS:.0f} ms, every event delivered): {verdict}")
    if not args.no_write:
        stamp = datetime.now(UTC)
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / f"progress-{stamp:%Y%m%dT%H%M%SZ}.json").write_text(
            json.dumps({"when": stamp.isoformat(), "setup": header, "rows": rows}, indent=1) + "\n"
        )
        RESULTS.write_text(
            "# Live progress: emit-to-receive latency and delivery\n\n"
            f"Written by `bench/progress.py` at {stamp:%Y-%m-%d %H:%M} UTC.\n\n"
            f"{header}.\n\n"
            "Latency: from the event row's `created_at` (the feed: the job's `updated_at`), taken as the row "
            "is written, before its commit, to the client's receipt of the bytes, on one clock; it includes the "
            "durable write. `one-job`: watchers of one `demo.sleep` job "
            f"({json.dumps(SLEEP_INPUT)}) run by the worker. `feed`: clients of `/ws/jobs/` while `demo.noop` "
            "jobs run. `spread`: clients over jobs that the bench drives. Server CPU: the web processes' CPU "
            "time while the events flow, per message delivered.\n\n"
            f"{report}\n\nAim (one job, 1,000 watchers: p99 <= {AIM_P99_MS:.0f} ms, every event delivered): "
            f"{verdict}.\n"
        )
        print(f"wrote {RESULTS.relative_to(BASE_DIR)}")


if __name__ == "__main__":
    main()
