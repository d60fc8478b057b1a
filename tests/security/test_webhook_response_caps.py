"""Item 8: a webhook receiver cannot hold a worker or fill its memory. The answer is read up to
WEBHOOK_RESPONSE_MAX_BYTES and for at most WEBHOOK_TIMEOUT seconds in all, then the connection
is closed: a receiver that streams a huge or endless body gets the delivery logged and retried."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_create, webhook_deliver

pytestmark = pytest.mark.django_db


class StreamingReceiver:
    """Answers every request with 500 and then a body of `chunk` every `pause` seconds, forever
    (until the client goes away); counts what it managed to send."""

    def __init__(self, *, chunk: bytes, pause: float) -> None:
        self.chunk, self.pause = chunk, pause
        self.sent = 0
        self.client_gone = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hook"
        self.stopping = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopping:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                                   b"Transfer-Encoding: chunked\r\n\r\n")
                try:
                    while not self.stopping:
                        connection.sendall(b"%x\r\n%s\r\n" % (len(self.chunk), self.chunk))
                        self.sent += len(self.chunk)
                        time.sleep(self.pause)
                except OSError:
                    self.client_gone.set()

    def close(self) -> None:
        self.stopping = True
        self.server.close()


def deliver_in_thread(delivery_id) -> threading.Thread:
    from django.db import connections

    def run() -> None:
        try:
            webhook_deliver(delivery_id=delivery_id)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def owner(settings):
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = True
    return make_user("shop")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("chunk", "pause"), [
    (b"x" * 65536, 0.0),   # a huge body, as fast as it goes
    (b"x", 0.05),          # an endless trickle, each byte well within the read timeout
])
def test_a_receiver_streaming_without_end_is_cut_off(owner, settings, monkeypatch, chunk, pause):
    # Only this test's thread delivers: no message for a worker that an earlier test left running.
    monkeypatch.setattr("webhooks.services._send_tasks", lambda ids: None)
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)  # this process runs it
    settings.WEBHOOK_TIMEOUT = 1.0
    settings.WEBHOOK_RESPONSE_MAX_BYTES = 100_000
    receiver = StreamingReceiver(chunk=chunk, pause=pause)
    try:
        webhook_create(owner=owner, url=receiver.url, events=["completed"])
        job, _ = job_submit(kind="demo.noop", owner=owner)
        job_execute(job_id=job.pk)
        delivery = WebhookDelivery.objects.get()
        thread = deliver_in_thread(delivery.pk)
        thread.join(60)  # a bound on liveness only: without the caps this never returns
        assert not thread.is_alive(), "the delivery is still reading the receiver's answer"
        assert receiver.client_gone.wait(10), "the connection was never closed"
        assert receiver.sent < 5_000_000
        delivery.refresh_from_db()
        assert delivery.status == "pending" and delivery.response_status == 500
        assert delivery.last_error.startswith("HTTP 500") and len(delivery.last_error) < 600
    finally:
        receiver.close()
