"""Many hosts (issue 17, point 4), built as network namespaces on this machine: a "data" host
with its own PostgreSQL (a throw-away initdb cluster) and Redis bound to its bridge addresses,
two worker hosts running `celery worker`, one web host running the ASGI server, and beat on the
data host. Then, for real:

1. one worker host is cut off mid-run (its link down): its jobs are taken back after the lease
   and finish on the other host, with no finished step run again;
2. it comes back: its stale runs cannot write (fencing), and it takes new work;
3. the web host is cut off from Redis only: submits still commit, the API answers without a 5xx,
   and the jobs are dispatched when Redis is reachable again.

Skipped, saying why, where namespaces cannot be made (not root, no `ip`). Everything is torn
down even when a step fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.chaos.servers import JobsDatabase, PrivatePostgres, _pg_bin, manage, redis_server_binary
from tests.cluster import netns
from tests.support.processes import child_env, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.worker]

VENV_BIN = Path(sys.executable).parent
LEASE = 4.0
GRACE = 3.0
ENV = {
    "JOBS_LEASE_SECONDS": str(LEASE),
    "JOBS_DISPATCH_GRACE": str(GRACE),
    "JOBS_RECONCILE_INTERVAL": "0.5",
    "WAITS_DUE_INTERVAL": "0.5",
    "REDIS_KEY_PREFIX": "cluster:",
    "LOG_LEVEL": "INFO",
    "WORKER_TASK_LOG": "true",  # the workers' `Task … received` lines are read below
}


class HostedPostgres(PrivatePostgres):
    """A private cluster whose server runs inside a host's namespace, on that host's address."""

    def __init__(self, root: Path, cluster: netns.Cluster, host: netns.Host) -> None:
        super().__init__(root, port=5432)
        self.cluster, self.host = cluster, host

    def init(self) -> HostedPostgres:
        super().init()
        # The other hosts connect over the bridge: trust the cluster's own /24, nothing else.
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.cluster.subnet}.0/24 trust\n")
        return self

    def start(self) -> HostedPostgres:
        if not self.data.exists():
            self.init()
        options = (f"-p {self.port} -k {self.root} -c listen_addresses={self.host.address} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(self.cluster.argv(self.host, ["runuser", "-u", "postgres", "--", _pg_bin("pg_ctl"), "-D",
                                                str(self.data), "-l", str(self.log), "-o", options, "-w", "-t",
                                                "30", "start"]), as_owner=False)
        return self

    def _run(self, argv: list[str], timeout: float = 60.0, as_owner: bool = True):  # type: ignore[override]
        if not as_owner:
            import subprocess

            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}")
            return result
        return super()._run(argv, timeout)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@{self.host.address}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(host=self.host.address, port=self.port, user="postgres", dbname=dbname,
                               autocommit=True, connect_timeout=5)


def ran_on(db: JobsDatabase, job_ids: list[str]) -> dict[str, str]:
    rows = db._rows("SELECT id::text, worker FROM jobs_job WHERE id::text = ANY(%s)", [job_ids])
    return {job_id: worker.split("-")[0] if worker else "" for job_id, worker in rows}


def step_history_ok(db: JobsDatabase, job_id: str) -> list[str]:
    """What is wrong with the job's steps: a step completed twice, or started again after it
    completed (a finished step run again). Empty when nothing is."""
    problems, completed = [], set()
    for _seq, kind, step, status in db.events(job_id):
        if kind != "step":
            continue
        if status == "completed":
            if step in completed:
                problems.append(f"step {step} completed twice")
            completed.add(step)
        elif status == "started" and step in completed:
            problems.append(f"step {step} started again after it completed")
    return problems


@pytest.fixture
def cluster():
    reason = netns.unavailable() or PrivatePostgres.unavailable()
    if reason:
        pytest.skip(f"no multi-host cluster on this machine: {reason}")
    workdir = Path(tempfile.mkdtemp(prefix="cluster-"))
    built = netns.Cluster(workdir)
    try:
        yield built.start()
    finally:
        built.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_hosts_cut_off_and_back(cluster):
    data = cluster.add_host("data", 2)
    redis_address = cluster.add_address(data, 3)
    hosts = {name: cluster.add_host(name, octet) for name, octet in (("host1", 11), ("host2", 12), ("web", 20))}
    postgres = HostedPostgres(cluster.workdir / "pg", cluster, data).start()
    try:
        database_url = postgres.create_database("cluster")
        redis_url = f"redis://{redis_address}:6379/0"
        # No protected mode: the other hosts reach it over the cluster's private bridge only.
        redis_argv = [redis_server_binary(), "--bind", redis_address, "--port", "6379", "--save", "", "--appendonly",
                      "no", "--protected-mode", "no", "--dir", str(cluster.workdir)]
        cluster.process(data, "redis", redis_argv, env=dict(os.environ),
                        ready_marker="Ready to accept connections").start()
        env = child_env(DATABASE_URL=database_url, REDIS_URL=redis_url, **ENV)
        manage("migrate", "--noinput", env=env)
        web_port = 8000
        web_url = f"http://{hosts['web'].address}:{web_port}"
        env = {**env, "PUBLIC_URL": web_url, "DJANGO_ALLOWED_HOSTS": hosts["web"].address}
        celery = str(VENV_BIN / "celery")
        workers = {
            name: cluster.process(hosts[name], name, [celery, "-A", "taskplatform", "worker", "--loglevel", "INFO",
                                                     "--concurrency", "2", "--without-mingle", "--without-gossip",
                                                     "--hostname", f"{name}-w@cluster"],
                                  env, ready_marker=" ready.")
            for name in ("host1", "host2")
        }
        beat = cluster.process(data, "beat", [celery, "-A", "taskplatform", "beat", "--loglevel", "INFO",
                                              "--schedule", str(cluster.workdir / "beat-schedule"),
                                              "--max-interval", "1"], env, ready_marker="beat: Starting")
        web = cluster.process(hosts["web"], "web", [str(VENV_BIN / "uvicorn"), "taskplatform.asgi:application",
                                                    "--host", hosts["web"].address, "--port", str(web_port),
                                                    "--lifespan", "off", "--log-level", "warning"], env)
        for process in (web, beat, *workers.values()):  # the web server warms up while the workers start
            process.start()
        wait_until(lambda: _status(f"{web_url}/healthz") == 200, timeout=60,
                   message=f"the web host does not answer:\n{web.output[-3000:]}")
        token = manage("create_api_token", "cluster", "--create", env=env).strip().splitlines()[-1]
        api = httpx.Client(base_url=web_url, headers={"Authorization": f"Token {token}"}, timeout=30)
        db = JobsDatabase(database_url)

        def submit(kind: str, input: dict) -> str:
            response = api.post("/api/jobs/", json={"kind": kind, "input": input})
            assert response.status_code == 201, (response.status_code, response.text[:1000])
            return response.json()["id"]

        # -- 1. a worker host is cut off mid-run -----------------------------------------------------------
        long_jobs = [submit("demo.sleep", {"seconds": 6, "steps": 6}) for _ in range(4)]
        wait_until(lambda: list(ran_on(db, long_jobs).values()).count("host1") >= 1
                   and set(db.statuses(long_jobs).values()) == {"processing"}, timeout=30,
                   message=f"host1 took none of the jobs: {ran_on(db, long_jobs)} {db.statuses(long_jobs)}")
        time.sleep(1.5)  # a step or two done on each
        on_host1 = [job_id for job_id, host in ran_on(db, long_jobs).items() if host == "host1"]
        cluster.cut(hosts["host1"])
        cut_at = time.monotonic()
        statuses = db.wait_terminal(long_jobs, timeout=90)
        recovered_in = time.monotonic() - cut_at
        assert set(statuses.values()) == {"completed"}, statuses
        jobs = db.jobs(long_jobs)
        for job_id in on_host1:
            assert ran_on(db, [job_id])[job_id] == "host2", "a job of the lost host did not finish on the other"
            assert jobs[job_id]["attempts"] >= 2, jobs[job_id]
            assert any(kind == "status" and status == "pending" for _, kind, _, status in db.events(job_id))
        for job_id in long_jobs:
            assert step_history_ok(db, job_id) == [], (job_id, db.events(job_id))
            assert db.event_seqs(job_id) == list(range(1, jobs[job_id]["event_seq"] + 1))

        # -- 2. it comes back: its stale runs are fenced, and it takes new work ----------------------------
        seqs_before = {job_id: db.jobs([job_id])[job_id]["event_seq"] for job_id in on_host1}
        lines_before = len(workers["host1"].lines)
        cluster.restore(hosts["host1"])
        restored_at = time.monotonic()
        wait_until(lambda: any("received" in line for line in workers["host1"].lines[lines_before:]),
                   timeout=60, message=f"host1 did not come back:\n{workers['host1'].output[-3000:]}")
        time.sleep(LEASE)  # its runs reach the database again and find the jobs gone
        for job_id in on_host1:
            assert db.jobs([job_id])[job_id]["event_seq"] == seqs_before[job_id], "a stale run wrote after the cut"
            assert db.jobs([job_id])[job_id]["status"] == "completed"
            assert step_history_ok(db, job_id) == []
        fresh = [submit("demo.sleep", {"seconds": 1.5, "steps": 1}) for _ in range(6)]
        assert set(db.wait_terminal(fresh, timeout=60).values()) == {"completed"}
        assert "host1" in ran_on(db, fresh).values(), f"host1 took no new work: {ran_on(db, fresh)}"
        back_in = time.monotonic() - restored_at

        # -- 3. the web host loses Redis only ----------------------------------------------------------------
        cluster.blackhole(hosts["web"], redis_address)
        blind = []
        started = time.monotonic()
        for _ in range(3):
            blind.append(submit("demo.noop", {}))
            listed = api.get("/api/jobs/", params={"status": "pending"})
            assert listed.status_code < 500, (listed.status_code, listed.text[:500])
        submit_seconds = (time.monotonic() - started) / 3
        assert set(db.statuses(blind).values()) <= {"pending", "processing", "completed"}
        cluster.unblackhole(hosts["web"], redis_address)
        healed_at = time.monotonic()
        assert set(db.wait_terminal(blind, timeout=60).values()) == {"completed"}
        dispatched_in = time.monotonic() - healed_at

        for process in (*workers.values(), beat, web):
            assert process.proc.poll() is None, f"{process.name} died:\n{process.output[-3000:]}"
        print(f"\ncluster: host1 cut with {len(on_host1)} of its jobs running; all {len(long_jobs)} completed on "
              f"host2 {recovered_in:.1f}s after the cut (lease {LEASE:g}s); host1 back and working "
              f"{back_in:.1f}s after its link came up, no stale write; web cut from Redis: 3 submits answered "
              f"201 in {submit_seconds:.1f}s each, dispatched {dispatched_in:.1f}s after Redis came back "
              f"(grace {GRACE:g}s)")
    except BaseException:
        if postgres.log.exists():
            print("\n--- data host's PostgreSQL log (tail) ---\n" + postgres.log.read_text()[-3000:])
        raise
    finally:
        with contextlib.suppress(Exception):
            for process in cluster.processes:
                process.stop(timeout=10)
        postgres.destroy()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=3).status_code
    except httpx.HTTPError:
        return None
