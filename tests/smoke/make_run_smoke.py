"""Smoke test of the deployment path: `make run` in this checkout against PostgreSQL and Redis,
driven only through HTTP, as `.ci/run` runs it after `make test`.

    DATABASE_URL=postgres://.../taskplatform_smoke REDIS_URL=redis://.../1 \\
        .venv/bin/python tests/smoke/make_run_smoke.py --recreate-database

Steps, each printed with its time; every wait is bounded:

1. `make run` has nothing to install (the virtualenv `make test` made is current).
2. `make run` starts: /healthz answers 200, then /readyz 200 with every check ok, the scheduler
   (celery beat) included.
3. A reviewer's API token (`manage.py create_api_token`, the one step not over HTTP).
4. `demo.review` submitted, its question answered over the API, the job completed.
5. A `demo.review` question with a 2-second deadline: beat's deadline pass expires it and the job
   fails with `question_expired`.
6. A `demo.generate` parked on the simulated service, woken by its callback, completed.
7. SIGTERM to `make`: it exits, and no process it started is left.

With `--embedded` (DATABASE_URL and REDIS_URL unset) the same steps run against `make run`'s own
defaults, a SQLite file and the embedded Redis under `var/`: what a new user runs first.

On any failure it prints the tail of `make run`'s output, kills every process `make run` started
(each process group), and exits 1. `--recreate-database` drops and creates the database named in
DATABASE_URL first (give it a database of its own). Exit 0 only when every step passed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"
STARTED = time.monotonic()


class StepFailed(Exception):
    pass


def say(text: str) -> None:
    print(f"smoke [{time.monotonic() - STARTED:6.1f} s] {text}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    """Call `probe` until it returns something truthy; StepFailed naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if last:
                return last
        time.sleep(interval)
    raise StepFailed(f"{what}: not within {timeout:g} s (last seen: {str(last)[:500]})")


class MakeRun:
    """`make run` in its own process group, its output kept, every process it starts tracked."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self._stop_watching = threading.Event()

    def start(self) -> None:
        self.proc = subprocess.Popen(["make", "run"], cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _watch(self) -> None:
        """Remember every descendant of make (services restart under new pids)."""
        while not self._stop_watching.is_set():
            self.remember()
            time.sleep(0.5)

    def remember(self) -> None:
        try:
            root = psutil.Process(self.proc.pid)
            for proc in [root, *root.children(recursive=True)]:
                self.seen.setdefault((proc.pid, proc.create_time()), proc)
        except psutil.Error:
            pass

    def alive(self) -> list[psutil.Process]:
        left = []
        for proc in self.seen.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
            except psutil.Error:
                continue
        return left

    def kill_everything(self) -> None:
        """SIGKILL every process group make run made, then every process left."""
        self._stop_watching.set()
        self.remember()
        for proc in self.alive():
            try:
                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.kill()
            except psutil.Error:
                pass
        if self.proc:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def tail(self, count: int = 150) -> str:
        return "\n".join(self.lines[-count:])


def database_recreate(url: str) -> None:
    """Drop and create the database named in `url` (connected to the server's `postgres` database)."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name or not name.replace("_", "").isalnum():
        raise StepFailed(f"refusing to recreate the database {name!r}: give the smoke test a plain name")
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def embedded_redis_running() -> bool:
    """Does the embedded Redis under var/ answer (`devtools.embedded_redis status`)?"""
    status = [str(PYTHON), "-m", "devtools.embedded_redis", "status"]
    return subprocess.run(status, cwd=ROOT, capture_output=True, timeout=30).returncode == 0


def run_smoke(args: argparse.Namespace) -> None:
    database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if args.embedded:
        if database_url or redis_url or args.recreate_database:
            raise StepFailed("--embedded runs `make run` as a new user does: unset DATABASE_URL and REDIS_URL, "
                             "and give no --recreate-database")
    elif not database_url or not redis_url:
        raise StepFailed("set DATABASE_URL and REDIS_URL (or give --embedded): the smoke test runs against the "
                         "real services")

    step = "make run has nothing to install"
    say(step)
    if subprocess.run(["make", "-q", ".venv/bin/.installed-run"], cwd=ROOT).returncode != 0:
        raise StepFailed(f"{step}: .venv is missing or older than requirements.txt (run `make test` first)")

    if args.recreate_database:
        say(f"fresh database {urlsplit(database_url).path.lstrip('/')}")
        database_recreate(database_url)

    redis_was_running = args.embedded and embedded_redis_running()
    port, flower_port = free_port(), free_port()
    metrics_token = secrets.token_hex(16)
    env = {key: value for key, value in os.environ.items() if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_POOL")}
    env.update(HOST="127.0.0.1", PORT=str(port), FLOWER_PORT=str(flower_port), METRICS_TOKEN=metrics_token,
               REDIS_KEY_PREFIX=f"smoke-{secrets.token_hex(4)}:", PYTHONUNBUFFERED="1")
    base = f"http://127.0.0.1:{port}"
    make_run = MakeRun(env)
    var_existed = (ROOT / "var").exists()
    say(f"make run on port {port} (Flower {flower_port})")
    make_run.start()
    try:
        http = httpx.Client(base_url=base, timeout=10)

        wait_for("GET /healthz answers 200", lambda: http.get("/healthz").status_code == 200, timeout=180)
        say("healthz: 200")

        def ready() -> dict | None:
            response = http.get("/readyz", headers={"Authorization": f"Bearer {metrics_token}"})
            body = response.json()
            return body if response.status_code == 200 else None

        body = wait_for("GET /readyz answers 200 (database, Redis, a worker, the scheduler)", ready, timeout=120)
        checks = body.get("checks") or {}
        say(f"readyz: 200 {checks}")
        if "scheduler" in checks and not checks["scheduler"].startswith("ok"):
            raise StepFailed(f"readyz: the scheduler check is not ok: {checks['scheduler']}")

        def reviewer_client(username: str) -> httpx.Client:
            say(f"API token for a reviewer (manage.py create_api_token {username} --create --reviewer)")
            command = [str(PYTHON), "manage.py", "create_api_token", username, "--create", "--reviewer"]
            # As the platform `make run` started runs: its development settings (a bare manage.py
            # loads production's, which refuse to start without DJANGO_SECRET_KEY).
            made = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60,
                                  env={**env, "DJANGO_SETTINGS_MODULE": "taskplatform.settings.development"})
            if made.returncode != 0:
                raise StepFailed(f"create_api_token failed: {made.stdout}{made.stderr}")
            return httpx.Client(base_url=base, timeout=10,
                                headers={"Authorization": f"Token {made.stdout.strip().splitlines()[-1]}"})

        api = reviewer_client("smoke-reviewer")

        def submit(kind: str, input: dict) -> str:
            response = api.post("/api/jobs/", json={"kind": kind, "input": input})
            if response.status_code != 201:
                raise StepFailed(f"POST /api/jobs/ {kind}: {response.status_code} {response.text[:300]}")
            return response.json()["id"]

        def job(job_id: str) -> dict:
            return api.get(f"/api/jobs/{job_id}/").json()

        def open_question(job_id: str) -> dict | None:
            results = api.get("/api/questions/", params={"status": "open", "job": job_id}).json()["results"]
            return results[0] if results else None

        def ended(job_id: str, status: str) -> Callable[[], dict | None]:
            def probe() -> dict | None:
                seen = job(job_id)
                if seen["status"] in ("completed", "failed", "cancelled") and seen["status"] != status:
                    raise StepFailed(f"job {job_id} ended {seen['status']}, not {status}: {seen.get('error')}")
                return seen if seen["status"] == status else None
            return probe

        # demo.review, answered over the API.
        review = submit("demo.review", {"document": "smoke test"})
        say(f"demo.review {review} submitted")
        question = wait_for("its question opens", lambda: open_question(review), timeout=30)
        answered = api.post(f"/api/questions/{question['id']}/answer/", json={"answer": {"approved": True}})
        if answered.status_code != 200:
            raise StepFailed(f"answer: {answered.status_code} {answered.text[:300]}")
        say(f"question {question['id']} answered")
        done = wait_for("the reviewed job completes", ended(review, "completed"), timeout=30)
        if done["result"] != {"approved": True, "reviewer": "smoke-reviewer"}:
            raise StepFailed(f"unexpected result {done['result']}")
        say(f"demo.review completed: {done['result']}")

        # A 2-second deadline, expired by beat's deadline pass.
        response = api.post("/api/jobs/", json={"kind": "demo.review",
                                                "input": {"document": "nobody answers", "timeout": 2}})
        if response.status_code == 201:
            late = response.json()["id"]
            say(f"demo.review {late} with a 2 s deadline submitted")
            question = wait_for("its question opens", lambda: open_question(late), timeout=30)
            failed = wait_for("beat expires the question and the job fails", ended(late, "failed"), timeout=45)
            if (failed.get("error") or {}).get("code") != "question_expired":
                raise StepFailed(f"the job failed with {failed.get('error')}, not question_expired")
            expired = api.get(f"/api/questions/{question['id']}/").json()
            if expired["status"] != "expired":
                raise StepFailed(f"the question is {expired['status']}, not expired")
            say("deadline: the question expired, the job failed with question_expired")
        elif "timeout" in response.text:
            # A platform whose demo.review takes no deadline yet: demo.expense's approval has one
            # (its policy answers "rejected" as the system).
            say("demo.review takes no `timeout` here; the deadline through demo.expense's approval instead")
            late = submit("demo.expense", {"employee": "Smoke", "amount": 10, "description": "deadline",
                                           "approvals": 1, "deadline_seconds": 2})
            other = reviewer_client("smoke-reviewer-2")  # a job's submitter may not answer demo.expense
            for answer in ("travel", {"amount": 10, "receipt_attached": True}):
                question = wait_for("its next question opens", lambda: open_question(late), timeout=30)
                reply = other.post(f"/api/questions/{question['id']}/answer/", json={"answer": answer})
                if reply.status_code != 200:
                    raise StepFailed(f"answer {question['key']}: {reply.status_code} {reply.text[:300]}")
                wait_for("the answer is taken", lambda q=question: api.get(f"/api/questions/{q['id']}/").json()[
                    "status"] != "open", timeout=30)
            question = wait_for("the approval with a 2 s deadline opens", lambda: open_question(late), timeout=30)
            if question["key"] != "approve" or not question["expires_at"]:
                raise StepFailed(f"expected the approval with a deadline, got {question}")
            done = wait_for("beat applies the deadline's policy", ended(late, "completed"), timeout=45)
            if done["result"].get("rejected_by") != "system":
                raise StepFailed(f"the deadline did not decide: {done['result']}")
            say(f"deadline: beat decided the approval as the system: {done['result']}")
        else:
            raise StepFailed(f"POST /api/jobs/ demo.review with a timeout: {response.status_code} "
                             f"{response.text[:300]}")

        # demo.generate, woken by the simulated service's callback.
        generate = submit("demo.generate", {"prompt": "smoke", "delay": 1})
        say(f"demo.generate {generate} submitted")
        done = wait_for("the generation completes", ended(generate, "completed"), timeout=45)
        events = api.get(f"/api/jobs/{generate}/events/").json()
        woken = [event for event in events if event["type"] == "wait" and event["status"] == "woken"]
        if not any((event.get("message") or {}).get("by") == "callback" for event in woken):
            raise StepFailed(f"no wake by callback among its events: {woken}")
        say(f"demo.generate completed, woken by its callback: {done['result']}")

        # SIGTERM: make (and through it the supervisor) stops everything it started.
        make_run.remember()
        count = len(make_run.alive())
        say(f"SIGTERM to make (pid {make_run.proc.pid}); {count} processes running")
        make_run.proc.send_signal(signal.SIGTERM)
        try:
            code = make_run.proc.wait(timeout=40)
        except subprocess.TimeoutExpired as exc:
            raise StepFailed("make run did not exit within 40 s of SIGTERM") from exc
        try:
            wait_for("no process left", lambda: not make_run.alive(), timeout=30)
        except StepFailed as exc:
            left = [f"{proc.pid} {' '.join(proc.cmdline())[:120]}" for proc in make_run.alive()]
            raise StepFailed(f"{exc}; still running: {left}") from None
        say(f"make exited ({code}); no process left")
        if "supervisor| stopped" not in make_run.lines:
            raise StepFailed("the supervisor did not say it stopped")
        if args.embedded and not redis_was_running and embedded_redis_running():
            raise StepFailed("make run left the embedded Redis it started running")
        if not args.embedded and not var_existed and (ROOT / "var").exists():
            raise StepFailed("make run made var/ although DATABASE_URL and REDIS_URL are set")
    except BaseException:
        say("make run's output (tail):\n" + make_run.tail())
        raise
    finally:
        make_run.kill_everything()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recreate-database", action="store_true",
                        help="drop and create the database in DATABASE_URL first (a database of the smoke test's own)")
    parser.add_argument("--embedded", action="store_true",
                        help="without DATABASE_URL and REDIS_URL: make run's defaults, SQLite and the embedded Redis "
                             "under var/, as a new user first runs it")
    args = parser.parse_args()
    # A CI timeout's SIGTERM: still stop every process make run started (the `finally` above).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit("smoke: stopped by SIGTERM"))
    try:
        run_smoke(args)
    except StepFailed as failure:
        say(f"FAIL: {failure}")
        return 1
    except Exception as exc:  # anything else is a failure too, named
        say(f"FAIL: {type(exc).__name__}: {exc}")
        return 1
    say("PASS: every step of the make run smoke test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
