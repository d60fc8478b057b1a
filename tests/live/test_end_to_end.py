"""Live progress through the real thing: uvicorn, a Celery worker, Redis, and real clients.

A `demo.sleep` job runs in the worker; its events are published from the worker process and
reach a `websockets` client through uvicorn, and an `httpx` client as Server-Sent Events.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from django.db import connection
from websockets.asyncio.client import connect

from jobs.models import Job
from jobs.services import job_submit
from tests.conftest import make_user
from tests.live.conftest import ticket_from, token_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def ws_url(server: str, path: str) -> str:
    return server.replace("http://", "ws://", 1) + path


def stored_events(job) -> list[dict]:
    return [event.as_dict() for event in Job.objects.get(pk=job.pk).events.order_by("seq")]


async def read_until_finished(ws, received: list[dict], *, stop_after: int | None = None) -> None:
    """Append the events of `ws` to `received` until the job's terminal status (or `stop_after`)."""
    while stop_after is None or len(received) < stop_after:
        message = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
        assert message["type"] == "event", message
        received.append(message["event"])
        if message["event"]["type"] == "status" and message["event"]["status"] in Job.TERMINAL:
            return


def test_a_websocket_client_gets_every_event_of_a_sleep_job_in_order_across_a_reconnect(worker, server):
    owner = make_user("olga")
    token = token_for(owner)
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 2, "steps": 10}, owner=owner)

    async def client() -> tuple[list[dict], list[dict]]:
        received: list[dict] = []
        snapshots = []
        ticket = await asyncio.to_thread(ticket_from, server, token)
        async with connect(ws_url(server, f"/ws/jobs/{job.pk}/?after=0&ticket={ticket}")) as ws:
            snapshots.append(json.loads(await ws.recv()))
            await read_until_finished(ws, received, stop_after=12)
        # The connection is gone while the job goes on; the client resumes from its last seq.
        await asyncio.sleep(0.6)
        ticket = await asyncio.to_thread(ticket_from, server, token)  # a ticket is good for one connection
        async with connect(ws_url(server, f"/ws/jobs/{job.pk}/?after={received[-1]['seq']}&ticket={ticket}")) as ws:
            snapshots.append(json.loads(await ws.recv()))
            await read_until_finished(ws, received)
            # Nothing after the last event: no duplicate arrives late.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), timeout=0.5)
        return received, snapshots

    received, snapshots = asyncio.run(client())
    assert [s["type"] for s in snapshots] == ["snapshot", "snapshot"]
    assert snapshots[1]["last_seq"] > 12, "the job should have gone on while the client was away"
    stored = stored_events(job)
    assert [e["seq"] for e in received] == list(range(1, len(stored) + 1))
    assert received == stored  # every event, in order, exactly as logged
    types = [e["type"] for e in received]
    assert types.count("progress") == 10 and types.count("step") == 20
    assert received[-1]["type"] == "status" and received[-1]["status"] == "completed"


def test_the_feed_follows_a_job_through_the_real_server(worker, server):
    owner = make_user("olga")
    token = token_for(owner)

    def submit() -> Job:
        try:
            return job_submit(kind="demo.noop", input={}, owner=owner)[0]
        finally:
            connection.close()  # this thread's own connection

    async def client() -> list[str]:
        ticket = await asyncio.to_thread(ticket_from, server, token)
        async with connect(ws_url(server, f"/ws/jobs/?ticket={ticket}")) as ws:
            job = await asyncio.to_thread(submit)
            statuses = []
            while not statuses or statuses[-1] not in Job.TERMINAL:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
                assert message["type"] == "job" and message["job"]["id"] == str(job.pk)
                statuses.append(message["job"]["status"])
            return statuses

    assert asyncio.run(client()) == ["pending", "processing", "completed"]


def sse_frames(response: httpx.Response) -> list[dict]:
    """Parse a text/event-stream body into its frames (comments and `retry:` skipped)."""
    frames, frame = [], {}
    for line in response.iter_lines():
        if not line:
            if "data" in frame:
                frames.append(frame)
            frame = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            frame[field] = value[1:] if value.startswith(" ") else value
    return frames


def test_server_sent_events_stream_a_job_until_it_finishes_and_resume_from_last_event_id(worker, server):
    owner, stranger = make_user("olga"), make_user("sam")
    token = token_for(owner)
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 1, "steps": 5}, owner=owner)
    url = f"{server}/api/jobs/{job.pk}/events/stream/"
    auth = {"Authorization": f"Token {token}"}

    with httpx.stream("GET", url, headers=auth, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(response)  # returns once the server ends the stream
    stored = stored_events(job)
    assert [int(f["id"]) for f in frames] == [e["seq"] for e in stored]
    assert [f["event"] for f in frames] == [e["type"] for e in stored]
    assert [json.loads(f["data"]) for f in frames] == stored
    assert stored[-1]["status"] == "completed"

    # A reconnecting EventSource sends Last-Event-ID; `?after=` does the same for a first request.
    with httpx.stream("GET", url, headers={**auth, "Last-Event-ID": "7"}, timeout=30) as response:
        assert [int(f["id"]) for f in sse_frames(response)] == list(range(8, len(stored) + 1))
    with httpx.stream("GET", f"{url}?after={len(stored) - 1}", headers=auth, timeout=30) as response:
        assert [int(f["id"]) for f in sse_frames(response)] == [len(stored)]

    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Token wrong"}, timeout=10).status_code == 401
    other = {"Authorization": f"Token {token_for(stranger)}"}
    assert httpx.get(url, headers=other, timeout=10).status_code == 404
    missing = f"{server}/api/jobs/00000000-0000-0000-0000-000000000000/events/stream/"
    assert httpx.get(missing, headers=auth, timeout=10).status_code == 404


def test_an_answer_reaches_a_websocket_client_as_its_event_then_the_jobs_move_in_order(worker, server):
    """An answer through the API writes its `question answered` event with the job's move to
    `pending`, in one statement (`job_transition(before=…)`): a client following the job gets
    both, numbered one after the other, then the resumed run's events, exactly as logged."""
    from approvals.models import Question
    from tests.support.processes import wait_until

    owner, reviewer = make_user("olga"), make_user("rita", reviewer=True)
    watcher, answerer = token_for(owner), token_for(reviewer)
    job, _ = job_submit(kind="demo.review", input={"document": "Contract v3"}, owner=owner)
    wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.PAUSED, timeout=30,
               message="the review did not pause on its question")
    question = Question.objects.get(job=job)

    async def client() -> list[dict]:
        received: list[dict] = []
        ticket = await asyncio.to_thread(ticket_from, server, watcher)
        async with connect(ws_url(server, f"/ws/jobs/{job.pk}/?after=0&ticket={ticket}")) as ws:
            assert json.loads(await ws.recv())["type"] == "snapshot"
            response = await asyncio.to_thread(
                httpx.post, f"{server}/api/questions/{question.pk}/answer/", json={"answer": {"approved": True}},
                headers={"Authorization": f"Token {answerer}"}, timeout=10)
            assert response.status_code == 200, response.text
            await read_until_finished(ws, received)
        return received

    received = asyncio.run(client())
    stored = stored_events(job)
    assert received == stored  # every event, in order, exactly as logged
    moves = [(e["type"], e["status"]) for e in received]
    answered = moves.index(("question", "answered"))
    assert moves[answered + 1] == ("status", "pending")
    assert received[answered + 1]["seq"] == received[answered]["seq"] + 1
    assert received[answered]["message"]["by"] == "rita"
    assert moves[-1] == ("status", "completed")
