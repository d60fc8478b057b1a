"""Where a webhook may send, so that a caller cannot use the workers to reach private networks
(server-side request forgery: Redis on 127.0.0.1, the cloud metadata service on 169.254.169.254,
an internal admin page).

Two checks, one policy. At registration, the URL itself: http(s), a host, no credentials, not a
literal non-public address or `localhost` (no DNS lookup there: a request must not wait on DNS,
an answer must not tell a caller which internal names exist, and DNS can change afterwards). At
delivery, the real protection: the host is resolved once, every address it resolves to must be
public, and the connection goes to a checked address (the URL's host stays in `Host` and in TLS's
SNI and certificate check), so a second DNS answer (DNS rebinding) cannot send it elsewhere.
Redirects are never followed.

WEBHOOKS_ALLOW_PRIVATE_NETWORKS switches the address policy off, for on-premise deployments whose
receivers are internal; the rest (scheme, host, credentials, pinning) still applies.

The model's validator imports this module in every process; only a worker that sends needs an HTTP
client, so httpx is imported by the two functions that use it (a worker's main process loads it
before it forks its pool: `taskplatform.celery.POOL_PRELOADED`).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

from jobs.errors import PlatformError

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Not covered (or not in every Python version) by ipaddress's own properties.
CARRIER_GRADE_NAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254"))
# How many of a host's addresses one attempt tries when connecting to the first ones fails.
MAX_ADDRESSES_TRIED = 4
PUBLIC_ONLY = "webhooks are only sent to public internet addresses"


class WebhookTargetRefused(PlatformError):
    """A URL the platform will not send webhooks to; the message says why."""

    code = "invalid"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="url")


class WebhookTargetUnresolved(Exception):
    """The host has no address now (DNS failed): worth trying again later."""


class WebhookSendFailed(Exception):
    """No answer from the receiver (refused, reset, timed out, not HTTP): worth trying again later.
    The message is the transport's error, its type first ("ConnectTimeout: ...")."""


def address_refusal(address: IPAddress) -> str | None:
    """Why `address` is not a public internet address ("a loopback address", …), or None when it
    is. IPv4 addresses embedded in IPv6 ones (mapped, 6to4, NAT64) are judged as themselves."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            reason = address_refusal(embedded)
            return f"{reason} ({embedded}) inside an IPv6 address" if reason else None
    if address in METADATA_ADDRESSES:
        return "the cloud metadata service's address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address in CARRIER_GRADE_NAT:
        return "a carrier-grade NAT address (100.64.0.0/10)"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local):
        return "a private address"
    if not address.is_global:
        return "not a public address"
    return None


def _literal_address(host: str) -> IPAddress | None:
    """`host` as an IP address when it is one, in any spelling a resolver accepts (`127.1`,
    `0x7f000001`, `2130706433` are 127.0.0.1); None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefx." for c in host) and any(c.isdigit() for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def webhook_url_check(url: str) -> None:
    """Refuse (WebhookTargetRefused, naming the problem) a URL that webhooks may not be sent to,
    judged without DNS: the scheme is not http(s) (https only under WEBHOOKS_REQUIRE_HTTPS), there
    is no host, it carries a user name or password, or its host is a literal non-public address or
    a `localhost` name (unless WEBHOOKS_ALLOW_PRIVATE_NETWORKS)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as exc:
        raise WebhookTargetRefused(f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookTargetRefused(f"must be an http or https URL, not {scheme or 'one without a scheme'}")
    if scheme == "http" and settings.WEBHOOKS_REQUIRE_HTTPS:
        raise WebhookTargetRefused("must be an https URL: this platform does not send webhooks over plain http")
    if not host:
        raise WebhookTargetRefused("has no host; give the full URL, such as https://hooks.example.com/jobs")
    if parts.username is not None or parts.password is not None:
        raise WebhookTargetRefused(
            "must not contain a user name or password; check the X-Webhook-Signature header instead"
        )
    if settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS:
        return
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        raise WebhookTargetRefused(f"{host} is this machine; {PUBLIC_ONLY}")
    address = _literal_address(name)
    reason = address_refusal(address) if address is not None else None
    if reason:
        raise WebhookTargetRefused(f"{host} is {reason}; {PUBLIC_ONLY}")


def webhook_url_validate(value: str) -> None:
    """`webhook_url_check` as a Django validator (the model field, so every form of it)."""
    try:
        webhook_url_check(value)
    except WebhookTargetRefused as exc:
        raise ValidationError(exc.message, code="invalid") from None


@dataclass(frozen=True)
class WebhookTarget:
    """A webhook URL whose host was resolved and checked: the addresses to connect to, in the
    resolver's order."""

    url: httpx.URL
    addresses: tuple[IPAddress, ...]


def _resolve(host: str, port: int) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        # A scoped IPv6 address ("fe80::1%eth0") keeps its scope out of the comparison.
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def webhook_target_resolve(*, url: str) -> WebhookTarget:
    """Check `url` (as `webhook_url_check`), resolve its host once and check every address it
    resolves to. WebhookTargetRefused when any one is not public (a name with one private address
    among public ones is refused too: it is a mistake or an attempt, and answers can be shuffled);
    WebhookTargetUnresolved when DNS gives no answer (worth another try later)."""
    import httpx

    webhook_url_check(url)
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise WebhookTargetRefused(f"not a valid URL ({exc})") from None
    host = parsed.raw_host.decode("ascii")  # IDNA-encoded, as DNS wants it
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        addresses = _resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise WebhookTargetUnresolved(f"cannot resolve {host}: {exc}") from None
    if not addresses:
        raise WebhookTargetUnresolved(f"{host} has no address")
    if not settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS:
        for address in addresses:
            reason = address_refusal(address)
            if reason:
                shown = host if str(address) == host else f"{host} resolves to {address}, which"
                raise WebhookTargetRefused(f"{shown} is {reason}; {PUBLIC_ONLY}")
    return WebhookTarget(url=parsed, addresses=tuple(addresses))


@dataclass(frozen=True)
class WebhookAnswer:
    """What a receiver answered: its status, headers and at most WEBHOOK_RESPONSE_MAX_BYTES of body."""

    status_code: int
    headers: httpx.Headers
    body: bytes

    @property
    def is_redirect(self) -> bool:
        return self.status_code in (301, 302, 303, 307, 308) and "Location" in self.headers

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _answer_read(response: httpx.Response, *, deadline: float) -> WebhookAnswer:
    """Read the body up to WEBHOOK_RESPONSE_MAX_BYTES and until `deadline`, whichever comes first:
    a receiver that streams a huge or endless answer must not hold the worker or its memory."""
    limit = settings.WEBHOOK_RESPONSE_MAX_BYTES
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) >= limit or time.monotonic() >= deadline:
            break
    return WebhookAnswer(status_code=response.status_code, headers=response.headers, body=bytes(body[:limit]))


def webhook_target_post(
    *, target: WebhookTarget, content: bytes, headers: dict[str, str], timeout: float
) -> WebhookAnswer:
    """POST `content` to a resolved target, connecting only to its checked addresses (the next
    one when a connection to one is refused), never following a redirect. `timeout` bounds each
    network operation and, checked between reads, the whole attempt; the answer's body is read
    up to WEBHOOK_RESPONSE_MAX_BYTES, uncompressed (`Accept-Encoding: identity`), and the
    connection closed after it.

    The request goes to the address itself; `Host` carries the URL's host and port, and for https
    the `sni_hostname` request extension makes TLS send the URL's host as SNI and verify the
    certificate against it (httpx's documented way to connect to an explicit IP). No answer at all
    raises WebhookSendFailed."""
    import httpx

    url = target.url
    host = url.raw_host.decode("ascii")
    is_literal = _literal_address(host) is not None
    host_header = f"[{host}]" if ":" in host else host
    if url.port is not None:
        host_header += f":{url.port}"
    extensions: dict[str, Any] = {} if is_literal else {"sni_hostname": host}
    # Environment proxies (HTTPS_PROXY, ...) are not used: the connection must go to the checked
    # address itself, and httpcore's proxy tunnel would send SNI and check the certificate for the
    # address, not the name. SSL_CERT_FILE and SSL_CERT_DIR still choose the trusted CAs, as they
    # do for httpx by default.
    client = httpx.Client(
        verify=httpx.create_ssl_context(trust_env=True), trust_env=False, timeout=timeout, follow_redirects=False
    )
    last_error: httpx.ConnectError | None = None
    deadline = time.monotonic() + timeout
    try:
        with client:
            for address in target.addresses[:MAX_ADDRESSES_TRIED]:
                try:
                    with client.stream(
                        "POST",
                        url.copy_with(host=str(address)),
                        content=content,
                        headers={**headers, "Host": host_header, "Accept-Encoding": "identity"},
                        extensions=extensions,
                    ) as response:
                        return _answer_read(response, deadline=deadline)
                except httpx.ConnectError as exc:  # the next address may answer (IPv6 or IPv4, one server down)
                    last_error = exc
                    logger.info("webhook: cannot connect to %s for %s: %s", address, host, exc)
        raise last_error or httpx.ConnectError(f"{host}: no address to connect to")
    except httpx.HTTPError as exc:
        raise WebhookSendFailed(f"{type(exc).__name__}: {exc}") from exc
