"""The websocket consumers against the real Redis channel layer (the test run's own prefix).

Each test runs its scenario with `async_to_sync`, so the consumer's database calls run in the
test's thread, on its (transactional) database.
"""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connection

from jobs.broadcast import publisher
from jobs.consumers import JobEventsConsumer
from jobs.events import event_append
from jobs.followed import job_group
from jobs.models import Job, JobEvent
from jobs.services import job_cancel, job_submit
from jobs.streams import LiveStreams
from taskplatform.asgi import application
from tests.conftest import make_user
from tests.live.conftest import session_cookie, ticket_for, token_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_dispatch():
    """No worker runs here: the jobs' Celery messages are not sent."""
    with mock.patch("jobs.services.transitions.job_dispatch"):
        yield


def log(job, text: str):
    return event_append(job_id=job.pk, type="log", status="info", message={"text": text})


def submit(owner, **input):
    return job_submit(kind="demo.noop", input=input, owner=owner)[0]


async def open_socket(path: str, *, cookie: str | None = None) -> WebsocketCommunicator:
    headers = [(b"cookie", cookie.encode())] if cookie else []
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator


async def receive(communicator: WebsocketCommunicator, timeout: float = 5) -> dict:
    return await communicator.receive_json_from(timeout=timeout)


async def receive_events(communicator: WebsocketCommunicator, count: int, timeout: float = 5) -> list[int]:
    seqs = []
    for _ in range(count):
        message = await receive(communicator, timeout)
        assert message["type"] == "event", message
        seqs.append(message["event"]["seq"])
    return seqs


async def assert_closed_with(communicator: WebsocketCommunicator, code: int) -> str:
    """The socket is closed with `code`; returns the reason given."""
    output = await communicator.receive_output(timeout=5)
    assert (output["type"], output.get("code")) == ("websocket.close", code), output
    return output.get("reason", "")


def run(scenario):
    async_to_sync(scenario)()
    assert publisher().flush(5)


def test_snapshot_then_live_events_in_order_without_replay():
    owner = make_user("olga")
    job = submit(owner)
    for number in range(3):
        log(job, f"before {number}")  # seqs 2..4: before the connection, never replayed

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/", cookie=await database_sync_to_async(session_cookie)(owner))
        snapshot = await receive(ws)
        assert snapshot["type"] == "snapshot" and snapshot["last_seq"] == 4
        assert snapshot["job"]["id"] == str(job.pk) and snapshot["job"]["status"] == "pending"
        assert set(snapshot["job"]) >= {"kind", "input", "result", "error", "progress", "attempts", "created_at"}
        for number in range(5):
            await database_sync_to_async(log)(job, f"live {number}")
        assert await receive_events(ws, 5) == [5, 6, 7, 8, 9]
        assert await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()

    run(scenario)


def test_replay_after_seq_then_live_and_nothing_replayed_when_after_is_at_the_end():
    owner = make_user("olga")
    job = submit(owner)
    for number in range(5):
        log(job, f"line {number}")  # seqs 2..6
    first, second = ticket_for(owner), ticket_for(owner)

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/?after=3&ticket={first}")
        assert (await receive(ws))["last_seq"] == 6
        assert await receive_events(ws, 3) == [4, 5, 6]
        event = await database_sync_to_async(log)(job, "live")
        message = await receive(ws)
        assert message == {"type": "event", "event": event.as_dict()}
        await ws.disconnect()

        at_end = await open_socket(f"/ws/jobs/{job.pk}/?after=7&ticket={second}")
        assert (await receive(at_end))["last_seq"] == 7
        assert await at_end.receive_nothing(timeout=0.3)
        await database_sync_to_async(log)(job, "after the end")
        assert await receive_events(at_end, 1) == [8]
        await at_end.disconnect()

    run(scenario)


def test_the_backlog_is_read_in_pages_with_no_gap_while_events_keep_coming():
    owner = make_user("olga")
    job = submit(owner)
    for number in range(30):
        log(job, f"old {number}")  # seqs 2..31
    ticket = ticket_for(owner)

    async def write_more():
        for number in range(60):
            await database_sync_to_async(log)(job, f"new {number}")
            await asyncio.sleep(0)

    async def scenario():
        with mock.patch.object(JobEventsConsumer, "page_size", 4):
            writer = asyncio.ensure_future(write_more())
            ws = await open_socket(f"/ws/jobs/{job.pk}/?after=0&ticket={ticket}")
            snapshot = await receive(ws)
            seqs = await receive_events(ws, 91)
            await writer
        assert snapshot["last_seq"] >= 31
        assert seqs == list(range(1, 92))
        assert await ws.receive_nothing(timeout=0.3)  # and no duplicate after
        await ws.disconnect()

    run(scenario)


def test_duplicates_are_dropped_and_a_gap_is_filled_from_the_database():
    owner = make_user("olga")
    job = submit(owner)
    ticket = ticket_for(owner)

    async def scenario():
        layer = get_channel_layer()
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={ticket}")
        assert (await receive(ws))["last_seq"] == 1
        second = await database_sync_to_async(log)(job, "two")
        assert await receive_events(ws, 1) == [2]
        # The same push again (a retried publish): dropped.
        group = job_group(job.pk)
        await layer.group_send(group, {"type": "job.event", "event": second.as_dict(), "group": group})
        assert await ws.receive_nothing(timeout=0.3)
        # Two events whose pushes are lost, then one that arrives: 3 and 4 come from the database.
        with mock.patch("jobs.events.event_publish"):
            await database_sync_to_async(log)(job, "three")
            await database_sync_to_async(log)(job, "four")
        assert await ws.receive_nothing(timeout=0.3)
        await database_sync_to_async(log)(job, "five")
        messages = [await receive(ws) for _ in range(3)]
        assert [m["event"]["seq"] for m in messages] == [3, 4, 5]
        assert [m["event"]["message"]["text"] for m in messages] == ["three", "four", "five"]
        assert await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()

    run(scenario)


def test_a_lost_last_push_is_found_by_the_periodic_check():
    owner = make_user("olga")
    job = submit(owner)
    ticket = ticket_for(owner)

    async def scenario():
        with mock.patch.object(LiveStreams, "resync_interval", 0.2):
            ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={ticket}")
            await receive(ws)
            with mock.patch("jobs.events.event_publish"):
                await database_sync_to_async(job_cancel)(job_id=job.pk)  # its push is lost
            message = await receive(ws, timeout=3)
            assert message["event"]["seq"] == 2 and message["event"]["status"] == "cancelled"
            await ws.disconnect()

    run(scenario)


def test_callers_who_may_not_see_the_job_are_refused_with_4403():
    owner, stranger = make_user("olga"), make_user("sam")
    job = submit(owner)
    stranger_cookie, stranger_ticket = session_cookie(stranger), ticket_for(stranger)

    async def scenario():
        for path, cookie in [
            (f"/ws/jobs/{job.pk}/", None),  # anonymous
            (f"/ws/jobs/{job.pk}/", stranger_cookie),  # signed in, not allowed
            (f"/ws/jobs/{job.pk}/?ticket={stranger_ticket}", None),
            (f"/ws/jobs/{job.pk}/?ticket=not-a-ticket", None),
            ("/ws/jobs/00000000-0000-0000-0000-000000000000/", stranger_cookie),  # no such job
            ("/ws/jobs/not-a-uuid/", stranger_cookie),
            ("/ws/jobs/", None),  # the feed needs a caller
        ]:
            ws = await open_socket(path, cookie=cookie)
            await assert_closed_with(ws, 4403)
        # A refused socket gets nothing, not even the events of the group it briefly joined.
        await database_sync_to_async(log)(job, "secret")

    run(scenario)
    # Nor did any of them mark the job followed: its events are pushed to nobody.
    assert Job.objects.values_list("followed_until", flat=True).get(pk=job.pk) is None


def test_a_caller_over_the_cap_of_live_streams_marks_nothing(settings):
    owner = make_user("olga")
    followed, other = submit(owner), submit(owner)
    cookie = session_cookie(owner)
    settings.LIVE_STREAMS_PER_USER = 1

    async def scenario():
        first = await open_socket(f"/ws/jobs/{followed.pk}/", cookie=cookie)
        assert (await receive(first))["type"] == "snapshot"
        refused = await open_socket(f"/ws/jobs/{other.pk}/", cookie=cookie)
        await assert_closed_with(refused, 4429)
        await first.disconnect()

    run(scenario)
    marks = dict(Job.objects.filter(pk__in=[followed.pk, other.pk]).values_list("pk", "followed_until"))
    assert marks[other.pk] is None
    if connection.vendor == "postgresql":  # elsewhere nothing is marked and every event is pushed (jobs.followed)
        assert marks[followed.pk] is not None


def test_a_bad_ticket_is_refused_even_with_a_valid_session():
    owner = make_user("olga")
    job = submit(owner)
    cookie = session_cookie(owner)

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket=wrong", cookie=cookie)
        await assert_closed_with(ws, 4403)
        ws = await open_socket(f"/ws/jobs/{job.pk}/", cookie=cookie)
        assert (await receive(ws))["type"] == "snapshot"
        await ws.disconnect()

    run(scenario)


def test_an_api_key_in_the_url_is_refused_and_a_ticket_is_good_for_one_connection():
    owner = make_user("olga")
    job = submit(owner)
    key, ticket = token_for(owner), ticket_for(owner)

    async def scenario():
        for path in (f"/ws/jobs/{job.pk}/?token={key}", f"/ws/jobs/?token={key}"):
            refused = await open_socket(path)
            assert "ticket" in await assert_closed_with(refused, 4403)
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={ticket}")
        assert (await receive(ws))["type"] == "snapshot"
        await ws.disconnect()
        again = await open_socket(f"/ws/jobs/{job.pk}/?ticket={ticket}")  # used: refused
        assert "expired" in await assert_closed_with(again, 4403)

    run(scenario)


def test_a_reviewer_sees_a_job_through_its_question():
    owner, reviewer = make_user("olga"), make_user("rita", reviewer=True)
    reviewer.is_staff = False  # only the question makes the job visible
    reviewer.save()
    job = submit(owner)
    first, second = ticket_for(reviewer), ticket_for(reviewer)

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={first}")
        await assert_closed_with(ws, 4403)
        from approvals.models import Question

        def ask_rita():
            Question.objects.create(job=job, key="q", prompt="?", schema={}, digest="x").assigned_users.add(reviewer)

        await database_sync_to_async(ask_rita)()
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={second}")
        assert (await receive(ws))["type"] == "snapshot"
        await ws.disconnect()

    run(scenario)


def test_the_feed_sends_status_changes_of_visible_jobs_only():
    owner, other, boss = make_user("olga"), make_user("sam"), make_user("boss", staff=True)
    owner_ticket, boss_ticket = ticket_for(owner), ticket_for(boss)

    async def scenario():
        mine = await open_socket(f"/ws/jobs/?ticket={owner_ticket}")
        everything = await open_socket(f"/ws/jobs/?ticket={boss_ticket}")
        own_job = await database_sync_to_async(submit)(owner)
        other_job = await database_sync_to_async(submit)(other)
        await database_sync_to_async(log)(own_job, "not a status change")
        await database_sync_to_async(job_cancel)(job_id=own_job.pk)

        got = [await receive(mine) for _ in range(2)]
        assert [(m["type"], m["job"]["id"], m["job"]["status"]) for m in got] == [
            ("job", str(own_job.pk), "pending"),
            ("job", str(own_job.pk), "cancelled"),
        ]
        assert got[1]["job"]["finished_at"] is not None
        assert await mine.receive_nothing(timeout=0.3)  # nothing of the other job, no log line
        seen = [(await receive(everything))["job"]["id"] for _ in range(3)]
        assert sorted(seen) == sorted([str(own_job.pk), str(other_job.pk), str(own_job.pk)])
        await mine.disconnect()
        await everything.disconnect()

    run(scenario)


def test_events_are_only_published_after_their_transaction_commits():
    from django.db import transaction

    owner = make_user("olga")
    job = submit(owner)
    ticket = ticket_for(owner)

    def rolled_back():
        with transaction.atomic():
            log(job, "never happened")
            transaction.set_rollback(True)

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={ticket}")
        await receive(ws)
        await database_sync_to_async(rolled_back)()
        assert await ws.receive_nothing(timeout=0.3)
        event = await database_sync_to_async(log)(job, "happened")
        assert event.seq == 2 and (await receive(ws))["event"]["message"]["text"] == "happened"
        await ws.disconnect()

    run(scenario)
    assert JobEvent.objects.filter(job=job).count() == 2


def test_a_burst_that_came_together_goes_out_in_one_write_in_order():
    """Events that reach the server while it is busy (here: its loop blocked for a moment) are
    taken together and written to each socket at once, in order, with no gap."""
    import threading
    import time

    owner = make_user("olga")
    job = submit(owner)
    cookie = session_cookie(owner)

    def burst():
        from django.db import connection

        for number in range(5):
            log(job, f"burst {number}")
        connection.close()

    async def scenario():
        first = await open_socket(f"/ws/jobs/{job.pk}/", cookie=cookie)
        second = await open_socket(f"/ws/jobs/{job.pk}/", cookie=cookie)
        for ws in (first, second):
            assert (await receive(ws))["last_seq"] == 1
        writer = threading.Thread(target=burst)
        writer.start()
        writer.join()
        time.sleep(0.5)  # the loop is busy: the pushes wait in Redis
        for ws in (first, second):
            assert await receive_events(ws, 5) == [2, 3, 4, 5, 6]
            assert await ws.receive_nothing(timeout=0.3)
            await ws.disconnect()

    with mock.patch.object(JobEventsConsumer, "deliver_batch", autospec=True,
                           side_effect=JobEventsConsumer.deliver_batch) as batches:
        run(scenario)
    assert batches.call_count == 2  # one batch, for each socket
