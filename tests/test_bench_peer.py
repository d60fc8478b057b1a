"""bench/shipped.py's peer at a small size: Procrastinate's schema in a database of its own, real
worker processes running every job deferred, the figures read from its own tables, and the
database gone at the end."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

DSN = os.environ.get("DATABASE_URL", "")

pytestmark = pytest.mark.skipif(not DSN.startswith("postgres"), reason="Procrastinate runs on PostgreSQL only")


@pytest.fixture
def peer_url():
    from bench.shipped import database_drop, peer_prepare

    parts = urlsplit(DSN)
    url = urlunsplit((parts.scheme, parts.netloc, f"/taskplatform_peer_test_{os.getpid()}", parts.query, ""))
    peer_prepare(url)
    yield url
    database_drop(url)
    with psycopg.connect(urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, ""))) as conn:
        name = urlsplit(url).path.lstrip("/")
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None


def test_the_peer_runs_every_job_it_defers_on_its_own_workers(peer_url):
    from bench.shipped import budget_lines, peer_phase

    first = peer_phase(40, 2, peer_url)
    assert first["count"] == 40 and first["per_second"] > 0 and first["version"].startswith("3.")
    assert first["drain_seconds"] >= 0 and first["first_claim_after_s"] >= 0
    budget = first["cpu_ms_per_job"]
    assert budget["pool"] > 0 and budget["postgres"] > 0  # the worker processes ran the jobs, on PostgreSQL
    # A second round on the same database counts only its own jobs (the first round's stay).
    second = peer_phase(10, 1, peer_url)
    assert second["count"] == 10
    with psycopg.connect(peer_url) as conn:
        rows = conn.execute("SELECT status, count(*) FROM procrastinate_jobs GROUP BY status").fetchall()
    assert rows == [("succeeded", 1 + 40 + 1 + 10)]  # each round's first job warms its workers
    lines = budget_lines({"peer": first})
    assert lines[0] == "| CPU ms per job | Procrastinate |" and "worker processes are its pool processes" in lines[-1]
