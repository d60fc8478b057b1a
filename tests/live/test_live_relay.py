"""`bench/live_relay.py`, the live streams' floor in `bench/progress.py --floor`: two forked server
processes sharing one port, each subscribed to a Redis channel, relay every published event to every
websocket, after a snapshot frame. Real processes, the real Redis, real websocket clients. No
figure is asserted: that is the bench's job."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis
from django.conf import settings
from websockets.asyncio.client import connect

from tests.live.conftest import free_port

BASE_DIR = Path(__file__).resolve().parent.parent.parent


def test_the_floors_relay_gives_every_socket_its_snapshot_and_every_event_in_order():
    url, port, channel = settings.REDIS_URL, free_port(), f"test-relay-{uuid.uuid4().hex}"
    relay = subprocess.Popen(
        [sys.executable, "bench/live_relay.py", "--port", str(port), "--processes", "2", "--redis", url,
         "--channel", channel, "--last-seq", "7"],
        cwd=BASE_DIR, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert [relay.stdout.readline().split()[0] for _ in range(2)] == ["listening", "listening"]
        publisher = redis.Redis.from_url(url)
        sent = [json.dumps({"type": "event", "event": {"seq": seq}}) for seq in range(8, 13)]

        async def watch() -> list[list[str]]:
            sockets = [await connect(f"ws://127.0.0.1:{port}/ws/jobs/any/") for _ in range(12)]
            snapshots = [json.loads(await ws.recv()) for ws in sockets]
            assert snapshots == [{"type": "snapshot", "last_seq": 7}] * 12
            for text in sent:
                publisher.publish(channel, text)
            received = [[await asyncio.wait_for(ws.recv(), 10) for _ in sent] for ws in sockets]
            for ws in sockets:
                await ws.close()
            return received

        deadline = time.monotonic() + 10
        while publisher.pubsub_numsub(channel)[0][1] < 2:  # both processes subscribed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert asyncio.run(watch()) == [sent] * 12
        publisher.close()
    finally:
        os.killpg(relay.pid, signal.SIGTERM)
        relay.wait(10)
