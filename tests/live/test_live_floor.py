"""`bench/live_floor.py` at a small size: two server processes hand bursts to the real fan-out
(consumers and wires over uvloop transports) and send the same bytes with a bare loop, and every
watcher got every event (the bench asserts it). No figure is asserted: that is the bench's job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent.parent


def test_the_live_floor_bench_runs_and_the_fan_out_reaches_every_watcher():
    out = subprocess.run(
        [sys.executable, "bench/live_floor.py", "--watchers", "40", "--pairs", "2", "--rounds", "4",
         "--period", "0.05", "--no-write"],
        cwd=BASE_DIR, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "µs |" in line]
    assert len(rows) == 2, out.stdout  # one row per server process, each with its figures
