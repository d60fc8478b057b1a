"""The live streams' floor: a bare relay from Redis to websockets, for `bench/progress.py --floor`.

    python bench/live_relay.py --port P --processes N --redis URL --channel C --last-seq S

The least a Python server does to put one published event on every open websocket: N processes
(forked after the listening socket is bound, so that they share it, as uvicorn's workers do), each
a uvloop loop running the `websockets` library's server (permessage-deflate off, as `make run`
serves), subscribed to one Redis pub/sub channel. A socket that connects (any path, no ticket, no
session, no database) gets a snapshot frame saying `last_seq` S; every message published on the
channel is handed as it is, already the frame's text, to `websockets.broadcast` over every socket
the process holds: one synchronous loop, no task per socket, no burst window, no seq check.

Each process writes `listening <pid>` to stdout once it serves and is subscribed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys


async def serve(sock: socket.socket, redis_url: str, channel: str, last_seq: int) -> None:
    import redis.asyncio as redis
    from websockets.asyncio.server import broadcast
    from websockets.asyncio.server import serve as ws_serve

    connections: set = set()
    snapshot = json.dumps({"type": "snapshot", "last_seq": last_seq})

    async def handler(connection) -> None:
        await connection.send(snapshot)
        connections.add(connection)
        try:
            await connection.wait_closed()
        finally:
            connections.discard(connection)

    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(channel)
    async with ws_serve(handler, sock=sock, compression=None, max_size=None):
        print(f"listening {os.getpid()}", flush=True)
        while True:
            message = await pubsub.get_message(timeout=None)
            if message is not None:
                broadcast(connections, message["data"].decode())


def child(sock: socket.socket, args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(sock, args.redis, args.channel, args.last_seq))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--redis", required=True, help="Redis URL")
    parser.add_argument("--channel", required=True, help="the pub/sub channel relayed")
    parser.add_argument("--last-seq", type=int, default=0, help="the snapshot's last_seq")
    args = parser.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(2048)
    children = []
    for _ in range(args.processes):
        pid = os.fork()
        if pid == 0:
            child(sock, args)
            os._exit(0)
        children.append(pid)
    sock.close()

    def stop(*_: object) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in children:
        os.wait()


if __name__ == "__main__":
    main()
