"""No API key in a URL (issue 16, item 3): websockets take a short-lived, single-use ticket, and
what the server logs of URLs (wake tokens, tickets, `token=`) is redacted."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from unittest import mock

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from rest_framework.test import APIClient
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from accounts.services import api_token_create, api_token_revoke
from jobs.services import job_submit
from ops.logging import redact
from taskplatform.asgi import application
from tests.conftest import make_user
from tests.live.conftest import asgi_server, ticket_from, wait_until_serving
from waits.models import Wait
from waits.services import token_fields_fresh, wake_token

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_ticket_is_given_for_one_connection_and_expires_within_a_minute():
    owner = make_user("olga")
    key = api_token_create(user=owner, name="test")[1]
    api = APIClient()
    assert api.post("/api/ws-tickets/").status_code == 401
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    before = timezone.now()
    response = api.post("/api/ws-tickets/")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"ticket", "expires_at"} and len(body["ticket"]) >= 32 and key not in body["ticket"]
    expires_at = datetime.fromisoformat(body["expires_at"])
    assert before < expires_at <= before + timedelta(seconds=60)
    assert api.post("/api/ws-tickets/").json()["ticket"] != body["ticket"]  # a new one each time


def test_a_ticket_of_a_token_revoked_since_is_refused():
    owner = make_user("olga")
    with mock.patch("jobs.services.transitions.job_dispatch"):
        job = job_submit(kind="demo.noop", input={}, owner=owner)[0]
    token, key = api_token_create(user=owner, name="test")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    ticket = api.post("/api/ws-tickets/").json()["ticket"]
    api_token_revoke(token=token)

    async def scenario():
        ws = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/?ticket={ticket}")
        assert (await ws.connect(timeout=5))[0]
        output = await ws.receive_output(timeout=5)
        assert (output["type"], output["code"]) == ("websocket.close", 4403)

    async_to_sync(scenario)()


def test_redact_hides_url_secrets_and_nothing_else():
    assert redact('"POST /api/wake/AbC-_12/ HTTP/1.1" 202') == '"POST /api/wake/[redacted]/ HTTP/1.1" 202'
    assert redact("/ws/jobs/42/?after=3&ticket=s3cr3t&x=1") == "/ws/jobs/42/?after=3&ticket=[redacted]&x=1"
    assert redact("/x/?token=abc") == "/x/?token=[redacted]"
    assert redact("/x/?a=1&access_token=abc") == "/x/?a=1&access_token=[redacted]"
    assert redact("/api/jobs/?status=paused") == "/api/jobs/?status=paused"


def test_the_server_log_holds_no_key_ticket_or_wake_token(transactional_db):
    """A real uvicorn with its access log on (the `make run` command line's log level): a
    websocket with a ticket, one with `?token=KEY` (refused), a wake, a wake with a bad token."""
    owner = make_user("olga")
    key = api_token_create(user=owner, name="test")[1]
    with mock.patch("jobs.services.transitions.job_dispatch"):
        job = job_submit(kind="demo.noop", input={}, owner=owner)[0]
    fields = token_fields_fresh()
    Wait.objects.create(job=job, key="generate", state=Wait.State.WAITING, **fields)
    wake = wake_token(fields["token_salt"])
    bad_wake = "B" * 43
    server = asgi_server(log_level="info").start()
    try:
        wait_until_serving(server.url)
        ticket = ticket_from(server.url, key)
        ws_url = server.url.replace("http://", "ws://", 1)

        async def sockets() -> None:
            async with connect(f"{ws_url}/ws/jobs/{job.pk}/?after=0&ticket={ticket}") as ws:
                assert '"snapshot"' in await ws.recv()
            async with connect(f"{ws_url}/ws/jobs/{job.pk}/?token={key}") as ws:
                with pytest.raises(ConnectionClosed) as refused:
                    await ws.recv()
                assert refused.value.rcvd.code == 4403

        asyncio.run(sockets())
        assert httpx.post(f"{server.url}/api/wake/{wake}/", timeout=10).status_code == 202
        assert httpx.post(f"{server.url}/api/wake/{bad_wake}/", timeout=10).status_code == 404
    finally:
        server.stop()
    log = server.output
    assert "/api/wake/[redacted]/" in log and "ticket=[redacted]" in log and "token=[redacted]" in log, log
    for secret in (key, ticket, wake, bad_wake):
        assert secret not in log, f"{secret} is in the server's log:\n{log}"
