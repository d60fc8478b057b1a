"""Webhooks may not be used to reach private networks (SSRF): refused at registration, and, the
real protection, at delivery, where the host is resolved once, every address checked, and the
connection made to the checked address."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from jobs.runner import job_execute
from jobs.services import job_submit
from tests.api.conftest import client_for
from tests.support.processes import wait_until
from tests.webhooks.conftest import receiver_running
from webhooks import targets
from webhooks.models import Webhook, WebhookDelivery
from webhooks.services import webhook_create, webhook_deliver, webhook_deliveries_send_due
from webhooks.targets import WebhookTargetRefused, address_refusal, webhook_url_check


@pytest.fixture
def api(submitter):
    return client_for(submitter)


@pytest.fixture
def dns(monkeypatch):
    """Fake DNS for chosen names: `dns.answer(name, [addresses], [later addresses], ...)` answers
    each list in turn, the last one from then on; every other name resolves as usual. Patched in
    the socket module, so a lookup by httpx itself would be answered (and counted) too."""
    real = socket.getaddrinfo

    class FakeDNS:
        def __init__(self):
            self.answers: dict[str, list[list[str]]] = {}
            self.lookups: list[str] = []

        def answer(self, name: str, *answers: list[str]) -> None:
            self.answers[name] = list(answers)

    fake = FakeDNS()

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002 (socket's names)
        name = host.decode() if isinstance(host, bytes) else host
        if name not in fake.answers:
            return real(host, port, family, type, proto, flags)
        fake.lookups.append(name)
        queue = fake.answers[name]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port), 0, 0)) if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port)))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return fake


@pytest.fixture
def loopback_counts_as_public(monkeypatch):
    """No public server is reachable from a test, so this stands one in: the policy treats
    127.0.0.1 (only that address) as public; everything else is judged as usual."""
    real = address_refusal
    monkeypatch.setattr(targets, "address_refusal",
                        lambda address: None if address == ipaddress.ip_address("127.0.0.1") else real(address))


def completed_job_delivery(owner) -> WebhookDelivery:
    job, _ = job_submit(kind="demo.noop", owner=owner)
    job_execute(job_id=job.pk)
    return WebhookDelivery.objects.get()


# --- registration ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url, says",
    [
        ("ftp://hooks.example.test/jobs", "must be an http or https URL, not ftp"),
        ("https://alice:s3cret@hooks.example.test/jobs", "must not contain a user name or password"),
        ("https://token@hooks.example.test/jobs", "must not contain a user name or password"),
        ("http://127.0.0.1:6379/", "127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is the cloud metadata service's address"),
        ("http://169.254.10.1/", "is a link-local address"),
        ("http://10.1.2.3/hook", "10.1.2.3 is a private address"),
        ("http://172.16.0.9/hook", "is a private address"),
        ("http://192.168.1.1/hook", "is a private address"),
        ("http://100.64.0.1/hook", "carrier-grade NAT"),
        ("http://0.0.0.0:8000/hook", "the unspecified address"),
        ("http://224.0.0.1/hook", "a multicast address"),
        ("http://[::1]:8000/hook", "::1 is a loopback address"),
        ("http://[fe80::1]/hook", "a link-local address"),
        ("http://[fd00:ec2::254]/hook", "the cloud metadata service's address"),
        ("http://[fc00::5]/hook", "a private address"),
        ("http://[::ffff:127.0.0.1]/hook", "a loopback address (127.0.0.1) inside an IPv6 address"),
        ("http://localhost:8000/hook", "localhost is this machine"),
        ("http://api.localhost/hook", "is this machine"),
    ],
)
def test_registration_refuses_what_webhooks_may_not_reach(api, url, says):
    response = api.post("/api/webhooks/", {"url": url, "events": ["completed"]}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid" and body["field"] == "url"
    assert says in body["detail"], body["detail"]
    assert not Webhook.objects.exists()


@pytest.mark.django_db
def test_a_private_address_names_what_to_do(api):
    detail = api.post("/api/webhooks/", {"url": "http://10.0.0.1/", "events": ["failed"]}, format="json").json()
    assert detail["detail"] == "url: 10.0.0.1 is a private address; webhooks are only sent to public internet addresses"


@pytest.mark.parametrize(
    "url, says",
    [
        ("http:///only/a/path", "has no host"),
        ("hooks.example.test/jobs", "not one without a scheme"),
        ("http://hooks.example.test:99999/", "not a valid URL"),
        ("http://2130706433/", "is a loopback address"),  # 127.0.0.1 spelt as a resolver accepts it
        ("http://0x7f000001/", "is a loopback address"),
        ("http://127.1/", "is a loopback address"),
        ("http://LOCALHOST./", "is this machine"),
    ],
)
def test_the_url_check_without_dns(url, says, settings):
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = False
    with pytest.raises(WebhookTargetRefused) as refused:
        webhook_url_check(url)
    assert says in refused.value.message and refused.value.field == "url"


@pytest.mark.parametrize(
    "address, says",
    [
        ("::ffff:169.254.169.254", "the cloud metadata service's address (169.254.169.254) inside"),
        ("2002:a00:1::", "a private address (10.0.0.1) inside"),  # 6to4
        ("64:ff9b::7f00:1", "a loopback address (127.0.0.1) inside"),  # NAT64
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("198.18.0.1", "a private address"),  # benchmarking
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
        ("::ffff:93.184.216.34", None),
    ],
)
def test_which_addresses_are_refused(address, says):
    reason = address_refusal(ipaddress.ip_address(address))
    assert (reason is None) if says is None else (says in reason), reason


@pytest.mark.django_db
def test_the_service_and_every_form_of_the_model_refuse_too(submitter):
    with pytest.raises(WebhookTargetRefused, match="loopback"):
        webhook_create(owner=submitter, url="http://127.0.0.1:6379/", events=["completed"])
    with pytest.raises(ValidationError) as invalid:
        Webhook(owner=submitter, url="http://169.254.169.254/", events=["completed"], secret="s").full_clean()
    assert "cloud metadata" in invalid.value.message_dict["url"][0]
    Webhook(owner=submitter, url="https://hooks.example.test/", events=["completed"], secret="s").full_clean()


@pytest.mark.django_db
def test_private_targets_register_when_the_deployment_allows_them(api, settings):
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = True
    response = api.post("/api/webhooks/", {"url": "http://10.1.2.3:8080/hook", "events": ["failed"]}, format="json")
    assert response.status_code == 201
    # Scheme and credentials are checked all the same.
    response = api.post("/api/webhooks/", {"url": "http://u:p@10.1.2.3/", "events": ["failed"]}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "url"


@pytest.mark.django_db
@override_settings(WEBHOOKS_REQUIRE_HTTPS=True)
def test_https_only_when_the_deployment_says_so(api):
    response = api.post("/api/webhooks/", {"url": "http://hooks.example.test/", "events": ["failed"]}, format="json")
    assert response.status_code == 400 and "must be an https URL" in response.json()["detail"]
    response = api.post("/api/webhooks/", {"url": "https://hooks.example.test/", "events": ["failed"]}, format="json")
    assert response.status_code == 201


# --- delivery -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_name_that_resolves_to_loopback_is_refused_at_delivery_and_not_retried(submitter, local_receiver, dns,
                                                                                 monkeypatch):
    # Registration does not resolve names: DNS decides at delivery.
    webhook_create(owner=submitter, url=f"http://loopback.example.test:{local_receiver.port}/hook",
                   events=["completed"])
    dns.answer("loopback.example.test", ["127.0.0.1"])
    delivery = completed_job_delivery(submitter)
    assert webhook_deliver(delivery_id=delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert delivery.last_error == ("refused: loopback.example.test resolves to 127.0.0.1, which is a loopback address; "
                                   "webhooks are only sent to public internet addresses")
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("failed", 1, None)
    assert local_receiver.received == []  # nothing was sent to the listening loopback server
    sent = []
    monkeypatch.setattr("webhooks.tasks.webhook_delivery_attempt.delay", sent.append)
    assert webhook_deliveries_send_due() == 0 and sent == []  # not retried
    assert webhook_deliver(delivery_id=delivery.pk) == "skipped"


@pytest.mark.django_db
def test_a_name_that_rebinds_to_the_metadata_address_is_refused_and_the_log_says_why(
    api, submitter, superuser, client, dns
):
    hook = api.post("/api/webhooks/", {"url": "https://hooks.attacker.test/x", "events": ["completed"]},
                    format="json").json()
    dns.answer("hooks.attacker.test", ["169.254.169.254"])
    delivery = completed_job_delivery(submitter)
    assert webhook_deliver(delivery_id=delivery.pk) == "failed"
    [logged] = api.get(f"/api/webhooks/{hook['id']}/deliveries/").json()["results"]
    assert logged["status"] == "failed" and logged["attempts"] == 1
    assert logged["last_error"] == (
        "refused: hooks.attacker.test resolves to 169.254.169.254, which is the cloud metadata service's address; "
        "webhooks are only sent to public internet addresses"
    )
    client.force_login(superuser)
    page = client.get(f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/").content.decode()
    assert "hooks.attacker.test resolves to 169.254.169.254" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    "answer, says",
    [
        (["93.184.216.34", "10.0.0.7"], "resolves to 10.0.0.7, which is a private address"),
        (["2606:4700::1111", "fe80::1"], "resolves to fe80::1, which is a link-local address"),
        (["::ffff:127.0.0.1"], "a loopback address (127.0.0.1) inside an IPv6 address"),
        (["100.100.100.200"], "carrier-grade NAT"),
    ],
)
def test_any_non_public_address_among_the_answers_refuses_the_delivery(submitter, dns, answer, says):
    webhook_create(owner=submitter, url="https://mixed.example.test/hook", events=["completed"])
    dns.answer("mixed.example.test", answer)
    delivery = completed_job_delivery(submitter)
    assert webhook_deliver(delivery_id=delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert says in delivery.last_error, delivery.last_error


@pytest.mark.django_db
def test_a_name_without_an_answer_is_retried(submitter, dns):
    webhook_create(owner=submitter, url="https://gone.example.test/hook", events=["completed"])
    dns.answer("gone.example.test", [])
    delivery = completed_job_delivery(submitter)
    assert webhook_deliver(delivery_id=delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.last_error == "DNS: gone.example.test has no address"


@pytest.mark.django_db
def test_a_private_name_is_delivered_when_the_deployment_allows_it(submitter, receiver, dns):
    # `receiver` turns WEBHOOKS_ALLOW_PRIVATE_NETWORKS on.
    webhook_create(owner=submitter, url=f"http://hooks.internal.test:{receiver.port}/in", events=["completed"])
    dns.answer("hooks.internal.test", ["127.0.0.1"])
    delivery = completed_job_delivery(submitter)
    assert webhook_deliver(delivery_id=delivery.pk) == "delivered"
    [request] = receiver.received
    assert request["path"] == "/in" and request["headers"]["Host"] == f"hooks.internal.test:{receiver.port}"


@pytest.mark.django_db
@override_settings(WEBHOOK_TIMEOUT=2)
def test_the_connection_goes_to_the_checked_address_even_when_dns_changes(
    submitter, local_receiver, dns, loopback_counts_as_public
):
    """DNS rebinding: the first answer passes the check, every later one points at the metadata
    service. The delivery reaches the checked address, and the name is looked up once."""
    webhook_create(owner=submitter, url=f"http://rebind.example.test:{local_receiver.port}/hook",
                   events=["completed"])
    dns.answer("rebind.example.test", ["127.0.0.1"], ["169.254.169.254"])
    delivery = completed_job_delivery(submitter)
    assert webhook_deliver(delivery_id=delivery.pk) == "delivered"
    [request] = local_receiver.received
    assert request["headers"]["Host"] == f"rebind.example.test:{local_receiver.port}"
    assert dns.lookups == ["rebind.example.test"]
    # The next delivery resolves again, and its answer is checked again.
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    second = WebhookDelivery.objects.exclude(pk=delivery.pk).get()
    assert webhook_deliver(delivery_id=second.pk) == "failed"
    second.refresh_from_db()
    assert "resolves to 169.254.169.254" in second.last_error and len(local_receiver.received) == 1


@pytest.mark.django_db
def test_the_next_checked_address_is_tried_when_one_refuses_the_connection(submitter, receiver, dns):
    webhook_create(owner=submitter, url=f"http://two.example.test:{receiver.port}/hook", events=["completed"])
    dns.answer("two.example.test", ["127.0.0.2", "127.0.0.1"])  # the receiver listens on 127.0.0.1 only
    delivery = completed_job_delivery(submitter)
    assert webhook_deliver(delivery_id=delivery.pk) == "delivered"
    assert len(receiver.received) == 1


@pytest.mark.django_db
def test_a_redirect_is_not_followed(submitter, local_receiver, dns, loopback_counts_as_public):
    with receiver_running() as inside:  # what a followed redirect would reach
        local_receiver.status, local_receiver.location = 302, f"http://127.0.0.1:{inside.port}/steal"
        webhook_create(owner=submitter, url=f"http://hop.example.test:{local_receiver.port}/hook",
                       events=["completed"])
        dns.answer("hop.example.test", ["127.0.0.1"])
        delivery = completed_job_delivery(submitter)
        assert webhook_deliver(delivery_id=delivery.pk) == "pending"
        assert len(local_receiver.received) == 1 and inside.received == []
    delivery.refresh_from_db()
    assert delivery.response_status == 302
    assert delivery.last_error == (f"HTTP 302: redirect to http://127.0.0.1:{inside.port}/steal not followed; "
                                   "register the URL that answers")


def tls_certificates(tmp_path, name: str) -> tuple[str, ssl.SSLContext]:
    """A CA file to trust, and a server context whose certificate (issued by that CA) is for `name`."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False), critical=True)
            builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                                            critical=False)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("Test webhooks CA", ca_key, "Test webhooks CA", ca_key, ca=True)
    server = certificate(name, server_key, "Test webhooks CA", ca_key, ca=False)
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "server.pem").write_bytes(server.public_bytes(pem) + ca.public_bytes(pem))
    (tmp_path / "server.key").write_bytes(server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    return str(tmp_path / "ca.pem"), context


@pytest.mark.django_db
@pytest.mark.parametrize("certificate_for, outcome", [("hooks.example.test", "delivered"),
                                                      ("other.example.test", "pending")])
def test_https_to_the_checked_address_sends_sni_and_verifies_the_certificate_for_the_name(
    submitter, dns, settings, monkeypatch, tmp_path, certificate_for, outcome
):
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = True  # the test's server is on 127.0.0.1
    ca_file, server_context = tls_certificates(tmp_path, certificate_for)
    monkeypatch.setenv("SSL_CERT_FILE", ca_file)
    with receiver_running(ssl_context=server_context) as tls_receiver:
        webhook_create(owner=submitter, url=f"https://hooks.example.test:{tls_receiver.port}/hook",
                       events=["completed"])
        dns.answer("hooks.example.test", ["127.0.0.1"])
        delivery = completed_job_delivery(submitter)
        assert webhook_deliver(delivery_id=delivery.pk) == outcome
    assert tls_receiver.server_names == ["hooks.example.test"]  # SNI is the name, not the address
    delivery.refresh_from_db()
    if outcome == "delivered":
        assert tls_receiver.received[0]["headers"]["Host"] == f"hooks.example.test:{tls_receiver.port}"
    else:  # a certificate for another name is refused: verification is against the URL's host
        assert tls_receiver.received == [] and "CERTIFICATE_VERIFY_FAILED" in delivery.last_error


@pytest.mark.worker
@pytest.mark.parametrize("host, says", [("localhost", "localhost is this machine"),
                                        ("127.0.0.1", "127.0.0.1 is a loopback address")])
def test_a_real_worker_refuses_a_loopback_target_under_the_default_policy(worker, submitter, local_receiver, host,
                                                                          says):
    # A row from before the check existed (the API refuses these URLs now).
    Webhook.objects.create(owner=submitter, url=f"http://{host}:{local_receiver.port}/hook",
                           events=["completed"], secret="s")
    job = client_for(submitter).post("/api/jobs/", {"kind": "demo.noop"}, format="json").json()
    delivery = wait_until(lambda: WebhookDelivery.objects.filter(job_id=job["id"], status="failed").first(),
                          timeout=30, message="the worker did not refuse the delivery")
    assert delivery.last_error.startswith(f"refused: {says}")
    assert delivery.attempts == 1 and local_receiver.received == []
