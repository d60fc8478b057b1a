"""The live fan-out's pass against the floor: a bare send loop over the same sockets.

    python bench/live_floor.py [--watchers 500] [--pairs 2] [--rounds 40] [--events 3] [--no-write]

At 1,000 watchers of one job, each of `make run`'s two web processes writes every burst of events
to its 500 sockets in one synchronous pass (`jobs.fanout.LocalFanout._hand_out`). This measures
what that pass costs per watcher, and what the least a Python server can do costs on the same
machine at the same moment: one `socket.send` per socket in a loop, the same bytes.

Each of `--pairs` server processes (uvloop, as uvicorn runs) accepts `--watchers` loopback TCP
connections from a reader process of its own, which reads every socket as it becomes readable
(as the clients of `bench/progress.py` do, without parsing). The server process holds one real
`JobEventsConsumer` per socket, writing through the real `UvicornWire` to a uvloop transport. The
wire's uvicorn protocol is a stand-in with the attributes the wire reads (whether a close was sent,
whether the peer left, the socket's extensions: none); everything else is the shipped code. Each
round hands a burst of `--events` consecutive events to the fan-out, then sends the same bytes with
the bare loop; the order alternates from round to round, and the pairs run at once, so both arms
share the machine's noise.

It prints, per watcher, the wall time and the CPU time (the process's, which on Linux includes
the kernel's TCP work done in its context) of each arm, as medians over the rounds, and writes
bench/results/live-floor-<UTC timestamp>.json and live-floor-latest.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import select
import socket
import statistics
import sys
import time
import types
from datetime import UTC, datetime
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

RESULTS_DIR = BASE_DIR / "bench" / "results"


def reader(port: int, watchers: int, seconds: float) -> None:
    """Connect `watchers` sockets and read each as it becomes readable, for `seconds`."""
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(watchers)]
    poller = select.epoll()
    by_fd = {sock.fileno(): sock for sock in sockets}
    for sock in sockets:
        poller.register(sock.fileno(), select.EPOLLIN)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for fd, _ in poller.poll(0.5):
            try:
                if not by_fd[fd].recv(262144):
                    poller.unregister(fd)
            except OSError:
                poller.unregister(fd)


def event(seq: int) -> dict:
    """A pushed `progress` event, shaped as `jobs.broadcast.event_publish` sends it."""
    return {"type": "job.event", "group": "job.bench", "job_id": "bench",
            "event": {"seq": seq, "type": "progress", "step": "", "status": "",
                      "message": {"fraction": seq / 1000, "text": f"step {seq} of 1000"},
                      "created_at": datetime.now(UTC).isoformat()}}


async def serve(args: argparse.Namespace, start_at: float) -> dict:
    from jobs.consumers import JobEventsConsumer, event_frame
    from jobs.fanout import LocalFanout, Push
    from jobs.wire import UvicornWire

    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(args.watchers + 16)
    child = os.fork()
    if child == 0:
        reader(listener.getsockname()[1], args.watchers, seconds=args.rounds * args.period + 30)
        os._exit(0)
    followers, raw = [], []
    for _ in range(args.watchers):
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, sock)
        protocol = types.SimpleNamespace(transport=transport, conn=types.SimpleNamespace(extensions=[]),
                                         close_sent=False, disconnected=False)
        consumer = JobEventsConsumer.__new__(JobEventsConsumer)
        consumer.wire, consumer.job_pk, consumer.last_seq = UvicornWire(protocol), "bench", 0
        consumer.catching_up = consumer.behind = consumer.finished = False
        followers.append(consumer)
        raw.append(sock)
    fanout = LocalFanout.__new__(LocalFanout)
    fanout.followers, fanout.per_follower = {"job.bench": set(followers)}, 10e-6
    seq = 0
    figures: dict[str, dict[str, list[float]]] = {"fan-out": {"wall": [], "cpu": []}, "bare": {"wall": [], "cpu": []}}
    await asyncio.sleep(max(0.0, start_at - time.time()))
    for number in range(args.rounds):
        messages = [event(seq + index + 1) for index in range(args.events)]
        seq += args.events
        frames = b"".join(Push(message).encoded("frame", event_frame) for message in messages)

        def fan_out(messages=messages) -> None:
            fanout._hand_out(messages)

        def bare(frames=frames) -> None:
            for sock in raw:
                sock.send(frames)

        arms = [("fan-out", fan_out), ("bare", bare)]
        for name, arm in arms if number % 2 == 0 else arms[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            arm()
            figures[name]["wall"].append((time.perf_counter() - wall) / args.watchers * 1e6)
            figures[name]["cpu"].append((time.process_time() - cpu) / args.watchers * 1e6)
            await asyncio.sleep(args.period / 2)  # the readers drain; the transports stay empty
    assert all(follower.last_seq == seq for follower in followers), "the fan-out skipped a watcher"
    os.kill(child, 9)
    os.waitpid(child, 0)
    return {name: {kind: round(statistics.median(values), 2) for kind, values in arm.items()}
            for name, arm in figures.items()}


def server_process(args: argparse.Namespace, start_at: float, out: int) -> None:
    import uvloop

    result = uvloop.run(serve(args, start_at))
    os.write(out, json.dumps(result).encode())
    os.close(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", type=int, default=500, help="sockets per server process")
    parser.add_argument("--pairs", type=int, default=2, help="server processes (each with a reader) at once")
    parser.add_argument("--rounds", type=int, default=40, help="bursts per arm")
    parser.add_argument("--events", type=int, default=3, help="events per burst")
    parser.add_argument("--period", type=float, default=0.2, help="seconds between two rounds")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    import django

    django.setup()
    start_at = time.time() + 3 + args.watchers * args.pairs / 500  # every pair connected by then
    pipes, children = [], []
    for _ in range(args.pairs):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            server_process(args, start_at, write_end)
            os._exit(0)
        os.close(write_end)
        pipes.append(read_end)
        children.append(pid)
    results = []
    for read_end, pid in zip(pipes, children, strict=True):
        with os.fdopen(read_end) as pipe:
            results.append(json.loads(pipe.read()))
        os.waitpid(pid, 0)

    taken = datetime.now(UTC)
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    lines = [f"# The live fan-out's pass against a bare send loop, {taken:%Y-%m-%dT%H:%M:%SZ}", "",
             f"{args.pairs} server process(es) at once, {args.watchers} loopback sockets each, a reader process "
             f"per server; bursts of {args.events} events, {args.rounds} rounds per arm, alternating; {machine}; "
             f"load average at the end {', '.join(f'{v:.2f}' for v in os.getloadavg())}.", "",
             "| server | fan-out wall µs/watcher | bare wall µs/watcher | fan-out CPU µs/watcher | "
             "bare CPU µs/watcher | fan-out's extra CPU |",
             "|---:|---:|---:|---:|---:|---:|"]
    for index, result in enumerate(results, 1):
        ours, bare = result["fan-out"], result["bare"]
        lines.append(f"| {index} | {ours['wall']:.1f} | {bare['wall']:.1f} | {ours['cpu']:.1f} | {bare['cpu']:.1f} | "
                     f"{ours['cpu'] - bare['cpu']:+.1f} µs |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = f"{taken:%Y%m%dT%H%M%SZ}"
        (RESULTS_DIR / f"live-floor-{stamp}.json").write_text(json.dumps(
            {"taken": taken.isoformat(), "args": vars(args), "machine": machine, "servers": results}, indent=2))
        (RESULTS_DIR / "live-floor-latest.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
