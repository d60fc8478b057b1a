"""The periodic passes' scheduler (ops.scheduler, jobs.periodic): the lease that lets one beat
send, each pass's lock, and the heartbeat that /readyz, /metrics and the dashboard read.

Times are the database's: a test ages a row by writing `Now() - N s` into it, never by sleeping
or by pinning a host clock. Two schedulers and a kill -9, for real: tests/chaos/test_scheduler.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from prometheus_client.parser import text_string_to_metric_families

from jobs.clock import database_now
from jobs.periodic import PeriodicPassTask, pass_lock, pass_lock_connection_close, pass_run
from ops.models import PeriodicPass, SchedulerLease
from ops.scheduler import LEASE_NAME, periodic_pass_record, scheduler_lease_claim, scheduler_lease_release
from ops.workers import last_job_key, redis_client, worker_heartbeat, workers_key
from taskplatform.celery import app
from tests.conftest import make_user
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _lock_connection_closed():
    """The pass lock's own connection (PostgreSQL) must not outlive the test database."""
    yield
    pass_lock_connection_close()


def seconds_ago(seconds: float) -> ExpressionWrapper:
    """The database's now minus `seconds`."""
    return ExpressionWrapper(Now() - Value(timedelta(seconds=seconds)), output_field=DateTimeField())


def age_lease(seconds: float) -> None:
    """As if the leader had last renewed (and taken) the lease `seconds` ago."""
    SchedulerLease.objects.filter(name=LEASE_NAME).update(
        renewed_at=seconds_ago(seconds), acquired_at=seconds_ago(seconds), expires_at=seconds_ago(seconds - 15))


def passes_ran(seconds_ago_: float = 0.0) -> None:
    """Every scheduled pass finished without an error `seconds_ago_` ago."""
    from django.conf import settings

    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        PeriodicPass.objects.update_or_create(name=entry["task"], defaults={"runs": 1})
    PeriodicPass.objects.update(last_finished_at=seconds_ago(seconds_ago_), last_succeeded_at=seconds_ago(seconds_ago_))


@pytest.fixture
def a_worker(settings):
    """A fresh heartbeat of a worker on the default queue, under a Redis prefix of this test's own,
    so that only the scheduler decides /readyz."""
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}sched-{uuid.uuid4().hex[:8]}:"
    worker_heartbeat(hostname="w@host", queues=["jobs"], started_at=time.time())
    yield
    redis_client().delete(workers_key(), last_job_key())


PROBE_TOKEN = "scheduler-probe-token"


@pytest.fixture(autouse=True)
def probe_token(settings):
    """The detail of /readyz is for staff and the METRICS_TOKEN (tests/security/test_health_detail.py)."""
    settings.METRICS_TOKEN = PROBE_TOKEN


def readyz(client) -> tuple[int, dict]:
    response = client.get("/readyz", HTTP_AUTHORIZATION=f"Bearer {PROBE_TOKEN}")
    return response.status_code, response.json()


# -- the lease ---------------------------------------------------------------------------------------
def test_one_scheduler_holds_the_lease_until_it_expires_by_the_database_clock():
    first = scheduler_lease_claim(holder="beat-a", lease=15)
    assert (first.holder, first.epoch) == ("beat-a", 1) and 14 < first.remaining <= 15
    standby = scheduler_lease_claim(holder="beat-b", lease=15)
    assert (standby.holder, standby.epoch) == ("beat-a", 1)  # b stands by
    renewed = scheduler_lease_claim(holder="beat-a", lease=15)
    assert (renewed.holder, renewed.epoch) == ("beat-a", 1)

    SchedulerLease.objects.filter(name=LEASE_NAME).update(expires_at=seconds_ago(0.001))  # a went silent
    taken = scheduler_lease_claim(holder="beat-b", lease=15)
    assert (taken.holder, taken.epoch) == ("beat-b", 2)
    assert scheduler_lease_claim(holder="beat-a", lease=15).holder == "beat-b"  # a, back, stands by

    assert scheduler_lease_release(holder="beat-a") is False  # not a's to give
    assert scheduler_lease_release(holder="beat-b") is True  # a clean stop: a standby takes over at once
    # (once the database's clock has moved past the release: SQLite's counts milliseconds, and a claim in the
    # release's own millisecond finds the lease expiring, not expired)
    released = SchedulerLease.objects.get(name=LEASE_NAME).expires_at
    wait_until(lambda: database_now() > released, timeout=5, interval=0.001)
    assert scheduler_lease_claim(holder="beat-a", lease=15).holder == "beat-a"


def test_the_leader_sleeps_until_each_pass_is_due_and_sends_it_on_time(transactional_db):
    """Beat's loop as `celery beat` runs it (tick, then sleep for what the tick returned, if
    anything) over the leader's scheduler, two passes due every half second, for 2.5 s: each is
    sent every half second, and between two sends beat sleeps. Celery's own scheduler woke 10 ms
    early and ticked without sleeping until each pass was due: hundreds of ticks here. (A
    transactional test: the scheduler closes its connection between claims, as beat does.)"""
    from ops.scheduler import LeaderScheduler

    sent: dict[str, list[float]] = {"a": [], "b": []}

    class Recording(LeaderScheduler):
        def setup_schedule(self) -> None:
            self.merge_inplace({name: {"task": f"tests.{name}", "schedule": 0.5} for name in sent})

        def apply_async(self, entry, producer=None, advance=True, **kwargs):
            sent[entry.name].append(time.monotonic())

    scheduler = Recording(app=app)
    ticks = 0
    began = time.monotonic()
    try:
        while time.monotonic() - began < 2.5:
            interval = scheduler.tick()
            ticks += 1
            if interval and interval > 0.0:
                time.sleep(interval)
        assert scheduler.leading
    finally:
        scheduler.close()
    for name, times in sent.items():
        assert len(times) >= 4, (name, times)
        gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        assert all(0.45 < gap < 0.95 for gap in gaps), (name, gaps)
    assert ticks < 60, f"{ticks} ticks for {sum(map(len, sent.values()))} sends"


# -- each pass alone -----------------------------------------------------------------------------------
def test_every_task_beat_sends_is_a_periodic_pass(settings):
    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert isinstance(app.tasks[entry["task"]], PeriodicPassTask), entry["task"]


def test_a_pass_whose_lock_is_held_elsewhere_does_nothing_and_says_so(caplog):
    ran: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        # Another run, in another thread (PostgreSQL: its own session; SQLite: its own file handle).
        try:
            with pass_lock("waits.due") as taken:
                assert taken
                holding.set()
                release.wait(10)
        finally:
            pass_lock_connection_close()

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert holding.wait(10)
        assert pass_run("waits.due", lambda: ran.append("second")) is None
    finally:
        release.set()
        other.join(10)
    assert ran == []
    assert "pass waits.due skipped: another run of it is in progress" in caplog.text
    assert PeriodicPass.objects.get(name="waits.due").skipped == 1

    assert pass_run("waits.due", lambda: ran.append("third") or 3) == 3  # the lock is free again
    assert ran == ["third"]
    record = PeriodicPass.objects.get(name="waits.due")
    assert record.runs == 1 and record.last_succeeded_at is not None and record.last_error == ""


def test_a_failing_pass_is_recorded_with_its_error():
    with pytest.raises(ZeroDivisionError):
        pass_run("jobs.reconcile", lambda: 1 / 0)
    record = PeriodicPass.objects.get(name="jobs.reconcile")
    assert record.runs == 1 and record.failures == 1 and record.last_succeeded_at is None
    assert record.last_error.startswith("ZeroDivisionError")


def test_recording_never_raises_even_for_an_unknown_event():
    periodic_pass_record(type("E", (), {"what": "began", "name": "x"})())  # ignored
    assert not PeriodicPass.objects.filter(name="x").exists()


# -- /readyz -------------------------------------------------------------------------------------------
def test_without_any_scheduler_readyz_is_503_naming_it(client, a_worker):
    status, body = readyz(client)
    assert status == 503, body
    assert body["checks"]["workers"].startswith("ok")
    assert body["checks"]["scheduler"].startswith("error: no scheduler (celery beat) has ever run")


def test_a_scheduler_silent_for_three_heartbeats_makes_readyz_503(client, a_worker, settings):
    settings.SCHEDULER_HEARTBEAT_INTERVAL = 5
    scheduler_lease_claim(holder="beat-a", lease=15)
    passes_ran()
    status, body = readyz(client)
    assert status == 200, body
    assert body["checks"]["scheduler"].startswith("ok: beat-a beat ")

    age_lease(14)  # within three heartbeats: still fine
    assert readyz(client)[0] == 200
    age_lease(16)
    status, body = readyz(client)
    assert status == 503
    assert body["checks"]["scheduler"].startswith("error: the scheduler (celery beat) is silent: its last heartbeat "
                                                  "was 16 s ago (more than 3 × 5 s), from beat-a")


def test_a_pass_that_stopped_running_makes_readyz_503_naming_it(client, a_worker, settings):
    settings.SCHEDULER_LEASE_SECONDS = 15
    scheduler_lease_claim(holder="beat-a", lease=15)
    passes_ran()
    PeriodicPass.objects.filter(name="waits.due").update(last_succeeded_at=seconds_ago(600))
    status, body = readyz(client)
    assert status == 503
    interval = settings.WAITS_DUE_INTERVAL
    assert body["checks"]["scheduler"] == (
        f"error: periodic passes are late: waits.due (every {interval:g} s, last ran 600 s ago); "
        "is a worker consuming 'platform'?"
    )


def test_a_pass_that_never_ran_is_late_only_once_a_leader_led_long_enough(client, a_worker, settings):
    scheduler_lease_claim(holder="beat-a", lease=15)
    assert readyz(client)[0] == 200  # just started: nothing is due yet
    age_lease(1)
    SchedulerLease.objects.filter(name=LEASE_NAME).update(acquired_at=seconds_ago(10_000))
    status, body = readyz(client)
    assert status == 503 and "jobs.reconcile (every" in body["checks"]["scheduler"]
    assert "never ran" in body["checks"]["scheduler"]


# -- /metrics and the dashboard ----------------------------------------------------------------------------
def test_metrics_show_the_heartbeat_age_and_each_pass(client, settings):
    settings.METRICS_TOKEN = "t0k"

    def scrape() -> dict:
        response = client.get("/metrics", headers={"Authorization": "Bearer t0k"})
        assert response.status_code == 200
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}

    samples = scrape()
    assert samples[("taskplatform_scheduler_heartbeat_age_seconds", ())] == float("inf")
    scheduler_lease_claim(holder="beat-a", lease=15)
    age_lease(42)
    pass_run("waits.due", lambda: None)
    samples = scrape()
    assert 42 <= samples[("taskplatform_scheduler_heartbeat_age_seconds", ())] < 50
    assert samples[("taskplatform_scheduler_lease_epoch", ())] == 1
    assert samples[("taskplatform_periodic_pass_age_seconds", (("pass", "waits.due"),))] < 5
    assert samples[("taskplatform_periodic_pass_age_seconds", (("pass", "jobs.reconcile"),))] == float("inf")
    assert samples[("taskplatform_periodic_pass_runs_total", (("outcome", "succeeded"), ("pass", "waits.due")))] == 1


def test_the_dashboard_shows_the_heartbeat_age(client):
    client.force_login(make_user("operator", staff=True))
    tile = next(t for t in client.get("/ops/data/").json()["tiles"] if t["key"] == "scheduler")
    assert tile["text"] == "never" and tile["alert"] is True
    scheduler_lease_claim(holder="beat-a", lease=15)
    passes_ran()
    age_lease(3)
    payload = client.get("/ops/data/").json()
    tile = next(t for t in payload["tiles"] if t["key"] == "scheduler")
    assert tile["label"] == "Scheduler heartbeat (beat)" and tile["alert"] is False
    assert tile["text"].endswith(" s ago") and 3 <= tile["value"] < 10
    assert payload["scheduler"]["leader"] == "beat-a"
    page = client.get("/ops/").content.decode()
    assert 'data-tile="scheduler"' in page
