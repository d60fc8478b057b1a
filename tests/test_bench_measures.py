"""The measures `bench/shipped.py` reads its figures with: PostgreSQL's commit probe (a slow
request set against the commits of the same moment), what the backends running the jobs' moves
wait for (`--pg-waits`) and the CPU budget (a worker's main process apart from its pool processes,
ended ones included)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from bench.shipped import CommitProbe, PgWaits, budget_lines, pg_waits_text, worker_cpu_split

DSN = os.environ.get("DATABASE_URL", "")

needs_postgresql = pytest.mark.skipif(not DSN.startswith("postgres"), reason="the probe commits to PostgreSQL")


@needs_postgresql
def test_the_commit_probe_times_its_commits_and_finds_the_worst_of_a_window():
    table = f"bench_commit_probe_{os.getpid()}"
    started = time.perf_counter()
    with CommitProbe(DSN, interval=0.005, table=table) as probe:
        deadline = time.monotonic() + 10  # a commit may stall on a slow disk: wait for five, not a set time
        while len(probe.commits) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    ended = time.perf_counter()
    assert len(probe.commits) >= 5
    slowest = max(took for _, took in probe.commits)
    assert probe.worst_ms(started, ended) == round(slowest * 1000, 1)
    assert probe.worst_ms(started - 10, started - 5) == 0.0  # no commit in that window
    summary = probe.summary()
    assert summary["n"] == len(probe.commits) and summary["max"] == round(slowest * 1000, 1)
    with psycopg.connect(DSN) as conn:
        assert conn.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None  # dropped at the end


BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


def test_the_cpu_budget_counts_a_pool_process_that_ended_apart_from_the_main_process():
    # A "main process" that runs a "pool process" burning 0.4 s of CPU, waits for it, then idles.
    main = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {BURN.format(seconds=0.4)!r}], check=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert main.stdout.readline().strip() == "ready"
        split = worker_cpu_split(main.pid)
        assert split["pool"] >= 0.35, split  # the ended child's CPU, counted once
        assert split["celery_main"] < split["pool"], split
    finally:
        main.kill()
        main.wait()


@needs_postgresql
def test_the_waits_sampler_counts_only_the_moves_and_tells_cpu_from_a_wait():
    """A statement shaped like a job's move counts, by what its backend does; another does not."""
    table = f"bench_pg_waits_{os.getpid()}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (n int)")
        conn.execute(f"INSERT INTO {table} VALUES (0)")
        try:
            with PgWaits(DSN, interval=0.005) as unshaped:
                conn.execute("SELECT pg_sleep(0.3)")
            assert unshaped.samples > 10 and sum(unshaped.counts.values()) == 0

            def moves() -> None:
                with psycopg.connect(DSN, autocommit=True) as mover:
                    mover.execute(f"WITH j AS (UPDATE {table} SET n = n + 1 RETURNING n) SELECT pg_sleep(0.3) FROM j")
                    mover.execute(f"WITH j AS (UPDATE {table} SET n = n + 1 RETURNING n) "
                                  "SELECT count(*) FROM j, generate_series(1, 3000000)")

            with PgWaits(DSN, interval=0.005) as waits:
                mover = threading.Thread(target=moves)
                mover.start()
                mover.join(timeout=30)
            assert waits.counts["other"] > 10  # pg_sleep: a wait of another kind
            assert waits.counts["on the CPU"] > 10  # counting a series: the CPU
            summary = waits.summary()
            assert summary["samples"] == waits.samples
            assert sum(summary["shares_percent"].values()) == pytest.approx(100, abs=0.5)
            assert "PostgreSQL's backends on the job's moves: on the CPU" in pg_waits_text(summary)
        finally:
            conn.execute(f"DROP TABLE {table}")


def test_the_waits_sampler_names_the_log_flushes_and_is_off_unless_asked():
    assert PgWaits.kind(None, None) == "on the CPU"
    assert PgWaits.kind("IO", "WALSync") == PgWaits.kind("IO", "WALWrite") == "flushing the log"
    assert PgWaits.kind("LWLock", "WALWrite") == "waiting for another's flush"
    assert PgWaits.kind("Client", "ClientRead") == "waiting for the client"
    assert PgWaits.kind("Lock", "transactionid") == "other"
    with PgWaits(None) as off:
        pass
    assert off.summary() == {} and pg_waits_text(off.summary()) == "" and not off.thread.is_alive()


def test_the_budget_table_lists_each_part_of_each_phase():
    part = {"celery_main": 1.0, "pool": 2.0, "postgres": 0.5, "redis": 0.25, "submitter": 0.25, "total": 4.0}
    lines = budget_lines({"bare": {"cpu_ms_per_job": part, "per_second": 500.0},
                          "platform": {"cpu_ms_per_job": part, "per_second": 125.0}})
    assert lines[0] == "| CPU ms per job | bare Celery | platform |"
    assert "| its pool processes (the tasks) | 2.00 | 2.00 |" in lines
    # 4 ms a job at 500 jobs/s is two cores busy; at 125 jobs/s, half of one.
    assert lines[-1] == f"| cores busy (all of them × jobs/s), of {os.cpu_count()} | 2.00 | 0.50 |"
    assert budget_lines({}) == []


def test_the_rounds_table_lists_each_round_and_the_median_ratios():
    from bench.shipped import round_summary, rounds_text

    def phase(rate: float, cpu: float) -> dict:
        return {"per_second": rate, "cpu_ms_per_job": {"total": cpu}}

    rounds = [round_summary({"bare": phase(1000.0, 2.0), "durable": phase(500.0, 3.5), "platform": phase(p, 6.0),
                             "ratio": p / 1000, "floor_ratio": 0.5, "platform_over_floor": p / 500})
              for p in (200.0, 300.0, 250.0)]
    assert rounds[0] == {"bare": 1000.0, "bare_cpu_ms_per_job": 2.0, "durable": 500.0, "durable_cpu_ms_per_job": 3.5,
                         "platform": 200.0, "platform_cpu_ms_per_job": 6.0, "ratio": 0.2, "floor_ratio": 0.5,
                         "platform_over_floor": 0.4}
    table = rounds_text(rounds).splitlines()
    assert table[2] == "| 1 | 1000.0 | 500.0 | 200.0 | 0.2 | 0.5 | 0.4 | 2.0, 3.5, 6.0 |"
    assert table[-1] == "| median | | | | 0.25 | 0.5 | 0.5 | |"


def test_a_durable_phase_ends_when_its_last_job_finished_not_at_the_poll_that_saw_it():
    from datetime import UTC, datetime, timedelta

    from bench.shipped import window_figures

    since = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    # 3,000 jobs, the last finished 5.0 s in; the quarter-second poll saw it at 5.2 s.
    assert window_figures(3000, 5.2, since, since + timedelta(seconds=5)) == {
        "seconds": 5.0, "per_second": 600.0, "seconds_polled": 5.2}
    # No row's time, or one the poll cannot have come before: the poll's.
    assert window_figures(3000, 5.2, since, None)["seconds"] == 5.2
    assert window_figures(3000, 5.2, since, since + timedelta(seconds=6))["seconds"] == 5.2
    assert window_figures(3000, 5.2, since, since - timedelta(seconds=1))["seconds"] == 5.2


@needs_postgresql
def test_the_scans_of_a_table_during_a_phase_are_counted():
    from bench.shipped import TableScans, scans_text

    table = f"bench_scans_{os.getpid()}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        try:
            conn.execute(f"INSERT INTO {table} SELECT generate_series(1, 100)")
            scans = TableScans(conn, table)
            with psycopg.connect(DSN, autocommit=True) as other:  # the phase's work, on a connection of its own
                other.execute("SET enable_indexscan = off; SET enable_bitmapscan = off")
                for key in (1, 2, 3):
                    other.execute(f"SELECT * FROM {table} WHERE id = %s", [key])
            counted = scans.stop()
        finally:
            conn.execute(f"DROP TABLE {table}")
    assert counted == {"table": table, "sequential": 3, "rows_read_sequentially": 300, "by_index": 0}
    assert scans_text(counted) == f"; {table}: 3 sequential scans (300 rows), 0 by index"


def _answering_server(delay: float):
    """A keep-alive HTTP server on a free port answering every request 201 after `delay` seconds,
    one at a time per connection, in a thread's event loop: (port, stop)."""
    import asyncio

    loop = asyncio.new_event_loop()
    answer = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                await asyncio.sleep(delay)
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def shutdown() -> None:
        server.close()
        handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)

    return server.sockets[0].getsockname()[1], stop


def test_paced_api_clients_send_at_the_rate_and_time_each_request_from_when_it_fell_due():
    import asyncio

    from bench.shipped import api_clients

    port, stop = _answering_server(delay=0.03)
    try:
        # Four connections paced to 40 requests a second in all, each answered in 30 ms: one every
        # 100 ms per connection, which the server keeps up with.
        kept_up = asyncio.run(api_clients(f"http://127.0.0.1:{port}", ["t"], 1.0, 4, rate=40))
        # One connection asked for 100 a second of a server that takes 30 ms each: it falls behind,
        # and each request's time counts from when it fell due, so the wait grows request by request.
        behind = asyncio.run(api_clients(f"http://127.0.0.1:{port}", ["t"], 1.0, 1, rate=100))
        # As fast as the answers come: about 33 a second.
        unpaced = asyncio.run(api_clients(f"http://127.0.0.1:{port}", ["t"], 1.0, 1))
    finally:
        stop()
    assert 36 <= kept_up["requests"] <= 41 and kept_up["errors"] == {}
    assert 28 <= kept_up["p50"] < 60
    assert behind["requests"] < 40  # not the 100 asked for: one request at a time, 30 ms each
    assert behind["latencies"][-1] > 400 and behind["latencies"][-1] > 5 * behind["latencies"][0]
    assert max(unpaced["latencies"]) < 100 and unpaced["requests"] >= 20
