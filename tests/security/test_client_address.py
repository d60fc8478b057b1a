"""Item 5: the ledger's client address cannot be forged. X-Forwarded-For is read from the right,
past the configured number of trusted proxies (as Django's documentation advises); whatever a
client writes on the left is ignored."""

from __future__ import annotations

import pytest
from django.test import RequestFactory, override_settings
from rest_framework.test import APIClient

from approvals.services import request_client_address
from jobs.client_address import client_address
from tests.approvals.conftest import paused_on

FORGED = "6.6.6.6"


def request(forwarded: str | None, remote: str = "10.0.0.1"):
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return RequestFactory().post("/", REMOTE_ADDR=remote, **extra)


@pytest.mark.parametrize(("proxies", "forwarded", "expected"), [
    (0, f"{FORGED}, 203.0.113.7", "10.0.0.1"),              # no proxy trusted: the peer itself
    (1, "203.0.113.7", "203.0.113.7"),                      # one proxy: the address it added
    (1, f"{FORGED}, 203.0.113.7", "203.0.113.7"),           # a forged left-most address is skipped
    (2, f"{FORGED}, 203.0.113.7, 10.0.0.2", "203.0.113.7"),  # two proxies: the second from the right
    (2, "203.0.113.7", "10.0.0.1"),                         # fewer hops than proxies: the peer
    (1, None, "10.0.0.1"),                                  # no header: the peer
    (1, "<script>", "10.0.0.1"),                            # not an address: the peer
    (1, f"{FORGED}, 2001:db8::7", "2001:db8::7"),
])
def test_the_client_is_the_right_most_hop_past_the_trusted_proxies(proxies, forwarded, expected):
    with override_settings(TRUSTED_PROXY_COUNT=proxies):
        assert client_address(request(forwarded)) == expected
        assert request_client_address(request(forwarded)) == expected


@pytest.mark.django_db
def test_an_answer_through_the_api_records_the_proxy_reported_address(reviewer):
    _, question = paused_on({})
    client = APIClient()
    client.force_authenticate(reviewer)
    with override_settings(TRUSTED_PROXY_COUNT=1):
        response = client.post(f"/api/questions/{question.pk}/answer/", {"answer": {"approved": True}},
                               format="json", REMOTE_ADDR="10.0.0.1",
                               HTTP_X_FORWARDED_FOR=f"{FORGED}, 198.51.100.4")
    assert response.status_code == 200, response.content
    ledger = client.get(f"/api/questions/{question.pk}/decisions/").json()
    assert ledger[-1]["client_address"] == "198.51.100.4"
