"""Pushes only to followers (`jobs.followed`): a job's events go to its group only while a web
process marks it followed, status changes to the feed only while the feed is; and a stream that
connects while a move is under way still misses nothing, against the real PostgreSQL and Redis.
Only PostgreSQL marks: elsewhere (SQLite) nothing is marked and every event is pushed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.db import connection, connections, transaction

from jobs import broadcast
from jobs.broadcast import publisher
from jobs.events import event_append
from jobs.fanout import LocalFanout
from jobs.followed import FEED_GROUP, MARK_SECONDS, groups_followed_mark, job_group
from jobs.models import FollowedGroup, Job
from jobs.services import job_cancel, job_submit, jobs_submit_many
from tests.conftest import make_user
from tests.live.conftest import session_cookie
from tests.live.test_consumers import open_socket, receive, receive_events

pytestmark = pytest.mark.django_db(transaction=True)

on_postgresql = connection.vendor == "postgresql"
marks_followed = pytest.mark.skipif(not on_postgresql, reason="only PostgreSQL marks what is followed (jobs.followed)")


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.transitions.job_dispatch"):
        yield


@pytest.fixture
def pushed():
    """The groups of each `publish_all` call that pushes anything, in order (the pushes still go
    out)."""
    calls: list[list[str]] = []
    real = broadcast.publish_all

    def record(pushes):
        if pushes:
            calls.append([group for group, _ in pushes])
        real(pushes)

    with mock.patch.object(broadcast, "publish_all", record):
        yield calls


def log(job_id, text: str):
    return event_append(job_id=job_id, type="log", status="info", message={"text": text})


def seconds_left(job_id) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM followed_until - statement_timestamp()) FROM jobs_job WHERE id = %s",
                       [job_id])
        return float(cursor.fetchone()[0])


@marks_followed
def test_nothing_is_pushed_for_a_job_nobody_follows_and_each_group_only_while_followed(pushed):
    job, _ = job_submit(kind="demo.noop", input={})
    log(job.pk, "nobody follows")
    job_cancel(job_id=job.pk)
    assert pushed == []  # not the submit's first event, not the log, not the status change

    groups_followed_mark([job_group(job.pk)])
    assert MARK_SECONDS - 5 < seconds_left(job.pk) <= MARK_SECONDS
    log(job.pk, "the job is followed")
    assert pushed == [[job_group(job.pk)]]

    groups_followed_mark([FEED_GROUP])
    other, _ = job_submit(kind="demo.noop", input={})  # its first event: to the feed only
    log(job.pk, "a log line is not a status change")
    job_cancel(job_id=other.pk)
    assert pushed[1:] == [[FEED_GROUP], [job_group(job.pk)], [FEED_GROUP]]

    Job.objects.filter(pk=job.pk).update(followed_until=None)
    FollowedGroup.objects.all().delete()
    log(job.pk, "followed no longer")
    assert len(pushed) == 4


@pytest.mark.skipif(on_postgresql, reason="PostgreSQL marks what is followed (above)")
def test_elsewhere_nothing_is_marked_and_every_event_is_pushed(pushed):
    job, _ = job_submit(kind="demo.noop", input={})
    log(job.pk, "nobody follows")
    job_cancel(job_id=job.pk)
    assert pushed == [[job_group(job.pk), FEED_GROUP], [job_group(job.pk)], [job_group(job.pk), FEED_GROUP]]
    groups_followed_mark([job_group(job.pk), FEED_GROUP])  # writes nothing
    assert Job.objects.values_list("followed_until", flat=True).get(pk=job.pk) is None
    assert not FollowedGroup.objects.exists()


@marks_followed
def test_a_mark_that_ran_out_stops_the_pushes_and_a_fresh_one_is_not_written_again(pushed):
    job, _ = job_submit(kind="demo.noop", input={})
    groups_followed_mark([job_group(job.pk), FEED_GROUP])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs_job SET followed_until = statement_timestamp() - interval '1 second'")
        cursor.execute("UPDATE jobs_followedgroup SET until = statement_timestamp() - interval '1 second'")
    job_cancel(job_id=job.pk)
    assert pushed == []

    groups_followed_mark([job_group(job.pk)])
    first = Job.objects.values_list("followed_until", flat=True).get(pk=job.pk)
    groups_followed_mark([job_group(job.pk)])  # more than REMARK_BELOW_SECONDS left: not written
    assert Job.objects.values_list("followed_until", flat=True).get(pk=job.pk) == first


@marks_followed
def test_a_batch_submit_pushes_its_first_events_to_the_feed_only_when_followed(pushed):
    jobs_submit_many(kind="demo.noop", inputs=[{}] * 5)
    assert pushed == []
    groups_followed_mark([FEED_GROUP])
    jobs_submit_many(kind="demo.noop", inputs=[{}] * 5)
    assert pushed == [[FEED_GROUP] * 5]


def test_a_stream_that_connects_while_a_move_holds_the_row_misses_nothing():
    """The move's statement found nobody following, so it pushes nothing; the stream's mark waits
    for the move's row lock, so the stream's first read comes after the move's commit and finds
    its event. The next move finds the mark and is pushed at once (not read back at the periodic
    check, seconds later). Elsewhere nothing is marked or waited for: the stream reads the job
    before the move commits, and every event, the move's too, is pushed."""
    owner = make_user("olga")
    job, _ = job_submit(kind="demo.noop", input={}, owner=owner)
    cookie = session_cookie(owner)  # before the move: a login writes, and SQLite's writer waits for the move's
    holding, release = threading.Event(), threading.Event()

    def move_held_open():
        try:
            with transaction.atomic():
                log(job.pk, "in flight while the stream connects")  # seq 2
                holding.set()
                release.wait(10)
        finally:
            connections.close_all()

    mover = threading.Thread(target=move_held_open)
    mover.start()
    assert holding.wait(5)

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/", cookie=cookie)
        try:
            if on_postgresql:
                assert await ws.receive_nothing(timeout=0.5)  # its mark waits for the move's row lock
            else:
                snapshot = await receive(ws)  # read before the move's commit
                assert snapshot["type"] == "snapshot" and snapshot["last_seq"] == 1
        finally:
            release.set()
        if on_postgresql:
            snapshot = await receive(ws)
            assert snapshot["type"] == "snapshot" and snapshot["last_seq"] == 2
        else:
            assert await receive_events(ws, 1, timeout=2) == [2]  # pushed at the move's commit
        await database_sync_to_async(log)(job.pk, "after the stream joined")
        assert await receive_events(ws, 1, timeout=2) == [3]  # pushed: the periodic check is 5 s away
        await ws.disconnect()

    try:
        async_to_sync(scenario)()
    finally:
        release.set()
        mover.join(10)
    assert publisher().flush(5)


@marks_followed
def test_a_renewal_marks_again_what_is_followed_skipping_rows_locked_now():
    followed, locked, left = (job_submit(kind="demo.noop", input={})[0] for _ in range(3))
    holding, release = threading.Event(), threading.Event()

    def lock_row():
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=locked.pk)
                holding.set()
                release.wait(10)
        finally:
            connections.close_all()

    async def scenario():
        fanout = LocalFanout.here()
        stream = mock.Mock()
        for job in (followed, locked, left):
            await fanout.follow(job_group(job.pk), stream)
        fanout.unfollow(job_group(left.pk), stream)
        await database_sync_to_async(Job.objects.update)(followed_until=None)
        locker.start()
        assert await asyncio.to_thread(holding.wait, 5)
        started = time.monotonic()
        await fanout.renew()  # the row locked by another transaction is skipped, not waited for
        assert time.monotonic() - started < 5
        for task in fanout.tasks:
            task.cancel()

    locker = threading.Thread(target=lock_row)
    try:
        async_to_sync(scenario)()
    finally:
        release.set()
        locker.join(10)
    marks = dict(Job.objects.values_list("pk", "followed_until"))
    assert marks[followed.pk] is not None
    assert marks[locked.pk] is None and marks[left.pk] is None


@marks_followed
def test_a_mark_the_database_lost_is_written_again_by_the_next_stream_of_the_job():
    """A process marks at every stream's open, not once: a mark already there costs a statement
    that writes nothing, and one the database lost (a restore, a table emptied under a running
    server, as between tests) is written back before that stream reads."""
    job, _ = job_submit(kind="demo.noop", input={})
    group = job_group(job.pk)
    followed_until = database_sync_to_async(lambda: Job.objects.get(pk=job.pk).followed_until)

    async def scenario():
        fanout = LocalFanout.here()
        await fanout.follow(group, mock.Mock())
        first = await followed_until()
        await fanout.follow(group, mock.Mock())
        assert await followed_until() == first  # fresh: not written again
        await database_sync_to_async(Job.objects.update)(followed_until=None)
        await fanout.follow(group, mock.Mock())
        assert await followed_until() is not None
        for task in fanout.tasks:
            task.cancel()

    async_to_sync(scenario)()


def test_a_mark_that_cannot_be_written_leaves_the_stream_to_its_periodic_check(caplog):
    job, _ = job_submit(kind="demo.noop", input={})

    async def scenario():
        fanout = LocalFanout.here()
        with mock.patch("jobs.fanout._groups_followed_mark", side_effect=RuntimeError("database away")):
            await fanout.follow(job_group(job.pk), mock.Mock())
        assert job_group(job.pk) in fanout.joined
        for task in fanout.tasks:
            task.cancel()

    async_to_sync(scenario)()
    assert "could not mark 1 group(s) followed: RuntimeError: database away" in caplog.text


def test_a_crowd_that_connects_to_one_job_at_once_marks_it_once_and_other_jobs_do_not_wait_for_it():
    jobs = [job_submit(kind="demo.noop", input={})[0] for _ in range(3)]
    calls: list[list[str]] = []
    in_flight = {"now": 0, "most": 0}

    async def slow_mark(groups, *, wait):
        calls.append(list(groups))
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        await asyncio.sleep(0.2)
        in_flight["now"] -= 1

    async def scenario():
        fanout = LocalFanout.here()
        with mock.patch("jobs.fanout._groups_followed_mark", slow_mark):
            crowd = [fanout.follow(job_group(jobs[0].pk), mock.Mock()) for _ in range(50)]
            others = [fanout.follow(job_group(job.pk), mock.Mock()) for job in jobs[1:]]
            started = time.monotonic()
            await asyncio.gather(*crowd, *others)
            elapsed = time.monotonic() - started
        for task in fanout.tasks:
            task.cancel()
        return elapsed

    elapsed = async_to_sync(scenario)()
    assert sorted(calls) == sorted([job_group(job.pk)] for job in jobs)  # one mark a job
    assert in_flight["most"] == 3 and elapsed < 0.5  # side by side, not one after the other


def test_a_server_sent_events_stream_marks_its_job_and_gets_the_next_event_pushed(server):
    """Through the real ASGI server: the SSE stream follows through the same fan-out, so its job
    is marked before its first read (on PostgreSQL: elsewhere every event is pushed), and an
    event written after that comes as a push (the stream's periodic check would take 5 s)."""
    import httpx

    from tests.live.conftest import token_for

    owner = make_user("olga")
    job, _ = job_submit(kind="demo.noop", input={}, owner=owner)  # no message sent: it stays pending
    url = f"{server}/api/jobs/{job.pk}/events/stream/"
    with httpx.stream("GET", url, headers={"Authorization": f"Token {token_for(owner)}"}, timeout=10) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("id:")) == "id: 1"
        if on_postgresql:
            assert Job.objects.values_list("followed_until", flat=True).get(pk=job.pk) is not None
        started = time.monotonic()
        log(job.pk, "after the stream's first read")
        assert next(line for line in lines if line.startswith("id:")) == "id: 2"
        assert time.monotonic() - started < 3


@marks_followed
def test_an_answer_pushes_its_job_whole_to_the_followed_feed_read_by_the_move_itself():
    """A status move's job goes to the feed with its input and result (`job_as_dict`): the move's
    statement reads them back, so the push after the commit sends no read of its own (a move
    that left them in the database made each push to a followed feed load them one by one)."""
    from django.test.utils import CaptureQueriesContext

    from approvals.models import Question
    from approvals.services import question_answer
    from jobs.runner import job_execute

    job, _ = job_submit(kind="demo.review", input={"document": "the feed shows this"})
    job_execute(job_id=job.pk)
    question = Question.objects.get(job=job, status=Question.Status.OPEN)
    groups_followed_mark([FEED_GROUP])
    sent: list[tuple[str, dict]] = []
    with mock.patch.object(broadcast, "publish_all", sent.extend), CaptureQueriesContext(connection) as answer:
        question_answer(question_id=question.pk, user=make_user("boss", superuser=True), answer={"approved": True})
    [status] = [data for group, data in sent if group == FEED_GROUP]
    assert status["job"]["status"] == "pending" and status["job"]["input"] == {"document": "the feed shows this"}
    reads = [query["sql"] for query in answer.captured_queries]
    assert not any(f'"jobs_job"."{name}" FROM "jobs_job"' in sql
                   for sql in reads for name in ("input", "result")), reads
