"""Live streams stay authorised while they are open (issue 16, item 6): a revoked token, a
deactivated user or a lost job closes them; a user holds a bounded number of them; an SSE
stream does not poll the database on its own.

The websocket and SSE streams run in this process (channels' communicators on the ASGI
application), against the real PostgreSQL and Redis: revocations travel as pushes through Redis.
"""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import ApplicationCommunicator, WebsocketCommunicator
from django.test import override_settings

from accounts.models import ApiToken
from accounts.services import api_token_create, api_token_revoke
from accounts.tickets import ws_ticket_issue
from jobs import sse
from jobs.broadcast import publisher
from jobs.services import job_cancel, job_submit
from jobs.streams import LiveStreams
from taskplatform.asgi import application
from tests.conftest import make_user
from tests.live.conftest import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.transitions.job_dispatch"):
        yield


@pytest.fixture(autouse=True)
def connections_of_ended_request_threads_closed():
    """Django runs each HTTP request's sync code in a thread of its own; once the thread is gone
    its database connection is only garbage, which the collector closes (before the test
    database is dropped, which open connections would prevent)."""
    yield
    import gc

    gc.collect()


def run(scenario):
    async_to_sync(scenario)()
    assert publisher().flush(5)


def submit(owner):
    return job_submit(kind="demo.noop", input={}, owner=owner)[0]


def key_and_ticket(user) -> tuple[ApiToken, str, str]:
    """An API token of `user`, its key, and a websocket ticket asked for with it."""
    token, key = api_token_create(user=user, name="test")
    return token, key, ws_ticket_issue(user=user, credential=("token", str(token.pk)))[0]


async def open_socket(path: str, cookie: str | None = None) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=[(b"cookie", cookie.encode())] if cookie else [])
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator


async def closed_with(communicator: WebsocketCommunicator, timeout: float = 5) -> tuple[int, str]:
    """Skip what the socket sends until it is closed; its close code and reason."""
    while True:
        output = await communicator.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return output.get("code"), output.get("reason", "")


async def open_sse(path: str, key: str) -> tuple[ApplicationCommunicator, dict]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"testserver"), (b"authorization", f"Token {key}".encode())],
        "client": ("127.0.0.1", 40000), "server": ("testserver", 80),
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=5)
    assert start["type"] == "http.response.start"
    return communicator, start


async def sse_read(communicator: ApplicationCommunicator, timeout: float = 5) -> tuple[str, bool]:
    """The next body chunk, and whether the stream goes on."""
    output = await communicator.receive_output(timeout=timeout)
    assert output["type"] == "http.response.body", output
    return output.get("body", b"").decode(), output.get("more_body", False)


async def sse_until_end(communicator: ApplicationCommunicator, timeout: float = 5) -> str:
    body, more = "", True
    while more:
        chunk, more = await sse_read(communicator, timeout)
        body += chunk
    return body


def test_revoking_a_token_closes_its_websockets_and_sse_streams_at_once():
    owner = make_user("olga")
    job = submit(owner)
    token, key, ticket = key_and_ticket(owner)
    _, other_key, other_ticket = key_and_ticket(owner)  # another token of the same user

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={ticket}")
        assert (await ws.receive_json_from(timeout=5))["type"] == "snapshot"
        feed = await open_socket(f"/ws/jobs/?ticket={other_ticket}")
        stream, start = await open_sse(f"/api/jobs/{job.pk}/events/stream/", key)
        assert start["status"] == 200
        assert "retry:" in (await sse_read(stream))[0]
        await database_sync_to_async(api_token_revoke)(token=token)
        # Pushed to every web process: no waiting for the periodic re-check.
        code, reason = await closed_with(ws)
        assert code == 4401 and "revoked" in reason
        await sse_until_end(stream)
        # The other token's socket stays open and live.
        await database_sync_to_async(job_cancel)(job_id=job.pk)
        assert (await feed.receive_json_from(timeout=5))["job"]["status"] == "cancelled"
        await feed.disconnect()

    with override_settings(LIVE_RECHECK_INTERVAL=3600):  # only the push can close them
        run(scenario)


def test_a_deactivated_user_and_a_job_no_longer_visible_are_found_by_the_periodic_recheck():
    owner, reviewer = make_user("olga"), make_user("rita", reviewer=True)
    job = submit(owner)
    _, key, ticket = key_and_ticket(owner)
    reviewer.is_staff = False  # sees the job only through its question
    reviewer.save()
    from approvals.models import Question

    question = Question.objects.create(job=job, key="q", prompt="?", schema={}, digest="x")
    question.assigned_users.add(reviewer)
    _, _, reviewer_ticket = key_and_ticket(reviewer)

    def deactivate():
        owner.is_active = False
        owner.save(update_fields=["is_active"])
        question.assigned_users.remove(reviewer)

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/?ticket={ticket}")
        assert (await ws.receive_json_from(timeout=5))["type"] == "snapshot"
        theirs = await open_socket(f"/ws/jobs/{job.pk}/?ticket={reviewer_ticket}")
        assert (await theirs.receive_json_from(timeout=5))["type"] == "snapshot"
        stream, _ = await open_sse(f"/api/jobs/{job.pk}/events/stream/", key)
        await sse_read(stream)
        await database_sync_to_async(deactivate)()
        assert await closed_with(ws) == (4401, "the user was deactivated")
        assert await closed_with(theirs) == (4403, "you may no longer see this job")
        await sse_until_end(stream)

    with override_settings(LIVE_RECHECK_INTERVAL=0.3):
        run(scenario)


def test_ending_the_session_closes_its_websocket_at_the_recheck():
    owner = make_user("olga")
    job = submit(owner)
    cookie = session_cookie(owner)

    def sign_out():
        from django.contrib.sessions.models import Session

        Session.objects.all().delete()

    async def scenario():
        ws = await open_socket(f"/ws/jobs/{job.pk}/", cookie=cookie)
        assert (await ws.receive_json_from(timeout=5))["type"] == "snapshot"
        await database_sync_to_async(sign_out)()
        code, _ = await closed_with(ws)
        assert code == 4401

    with override_settings(LIVE_RECHECK_INTERVAL=0.3):
        run(scenario)


def test_a_user_over_the_cap_of_live_streams_is_refused_clearly():
    owner = make_user("olga")
    job = submit(owner)
    _, key, _ = key_and_ticket(owner)
    tickets = [key_and_ticket(owner)[2] for _ in range(4)]

    async def scenario():
        first = await open_socket(f"/ws/jobs/{job.pk}/?ticket={tickets[0]}")
        assert (await first.receive_json_from(timeout=5))["type"] == "snapshot"
        stream, start = await open_sse(f"/api/jobs/{job.pk}/events/stream/", key)
        assert start["status"] == 200
        await sse_read(stream)
        # Two streams held (a websocket and an SSE stream): a third of either kind is refused.
        over = await open_socket(f"/ws/jobs/?ticket={tickets[1]}")
        code, reason = await closed_with(over)
        assert code == 4429 and "at most 2" in reason
        refused, start = await open_sse(f"/api/jobs/{job.pk}/events/stream/", key)
        assert start["status"] == 429
        body, _ = await sse_read(refused)
        assert '"code": "too_many_streams"' in body and "at most 2" in body
        # One ends: its place is free again.
        await first.disconnect()
        await asyncio.sleep(0.3)
        again = await open_socket(f"/ws/jobs/{job.pk}/?ticket={tickets[2]}")
        assert (await again.receive_json_from(timeout=5))["type"] == "snapshot"
        await again.disconnect()
        await stream.send_input({"type": "http.disconnect"})
        await asyncio.sleep(0.3)  # the SSE stream ends
        await LiveStreams.here().released()  # their places given back before this loop stops

    with override_settings(LIVE_STREAMS_PER_USER=2):
        run(scenario)


def test_idle_sse_streams_do_not_poll_the_database():
    owner = make_user("olga")
    job = submit(owner)
    _, key, _ = key_and_ticket(owner)
    reads = []
    real_read = sse._read

    async def counted_read(*args):
        reads.append(args)
        return await real_read(*args)

    async def scenario():
        streams = []
        for _ in range(5):
            stream, _ = await open_sse(f"/api/jobs/{job.pk}/events/stream/", key)
            assert "retry:" in (await sse_read(stream))[0]
            assert "id: 1\n" in (await sse_read(stream))[0]  # the backlog: one read each
            streams.append(stream)
        await asyncio.sleep(2.5)  # idle: a stream polling every second would read twice more
        assert len(reads) == 5
        # A live event reaches every stream from the push, without a read.
        await database_sync_to_async(job_cancel)(job_id=job.pk)
        for stream in streams:
            assert "event: status" in await sse_until_end(stream)
        assert len(reads) == 5

    with mock.patch.object(sse, "_read", counted_read):
        run(scenario)


def test_the_feed_shows_a_reviewer_the_jobs_they_may_answer_for():
    owner, reviewer = make_user("olga"), make_user("rita", reviewer=True)
    reviewer.is_staff = False
    reviewer.save()
    asked, other = submit(owner), submit(owner)
    from approvals.models import Question

    Question.objects.create(job=asked, key="q", prompt="?", schema={}, digest="x").assigned_users.add(reviewer)
    _, _, ticket = key_and_ticket(reviewer)

    async def scenario():
        feed = await open_socket(f"/ws/jobs/?ticket={ticket}")
        await database_sync_to_async(job_cancel)(job_id=other.pk)
        await database_sync_to_async(job_cancel)(job_id=asked.pk)
        message = await feed.receive_json_from(timeout=5)
        assert (message["job"]["id"], message["job"]["status"]) == (str(asked.pk), "cancelled")
        assert await feed.receive_nothing(timeout=0.3)
        await feed.disconnect()

    run(scenario)


def test_a_crowd_admitted_at_once_is_counted_exactly_against_the_cap():
    """150 streams of one user admitted together (a crowd connecting at once): the registry's
    Redis commands wait for a free slot rather than ask its client's pool (100 connections) for
    more, so the cap is checked for every one, never skipped: 100 in, 50 refused."""
    user = make_user("olga")

    class QuietStream:
        credential, job_pk, last_seq, finished = None, None, 0, False

        def __init__(self, number: int) -> None:
            self.stream_id, self.user = f"crowd-{number}", user

        def resync(self) -> None:
            pass

        def end(self, code: int, reason: str) -> None:
            pass

    async def scenario():
        registry = LiveStreams.here()
        streams = [QuietStream(number) for number in range(150)]
        refusals = await asyncio.gather(*(registry.admit(stream) for stream in streams))
        try:
            assert sum(refusal is None for refusal in refusals) == 100
        finally:
            for stream in streams:
                registry.release(stream)
            await asyncio.sleep(0.2)

    with override_settings(LIVE_STREAMS_PER_USER=100):
        run(scenario)
