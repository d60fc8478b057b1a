"""Who may reach what: every route the project serves (every HTTP URL pattern, every websocket
route, the SSE stream), each asked by six callers, with the status each must get.

The callers:
- `anonymous`: no credentials at all;
- `other`: a signed-in, active user who is not staff and owns nothing here;
- `revoked`: the owner's API token, revoked (`Authorization: Token ...`, nothing else);
- `deactivated`: a superuser since deactivated, with both their session and their token;
- `staff`: a staff user holding no permission;
- `owner`: the caller the route is for: the job's creator (`creator`), a reviewer who may answer
  its question (`reviewer`), or a superuser (`superuser`) for the admin and operations pages.

Each row names the URL pattern exactly as Django lists it, so `test_every_route_has_a_row` fails
when a route is added without one (and when a row outlives its route). A new row is one line:
the route, the path to ask (placeholders from `World`), and the six statuses. Rows that change
state (`fresh=True`) get a new world for each caller.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib import admin
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import URLResolver, get_resolver

from accounts.services import api_token_create, api_token_revoke
from approvals.models import Decision
from approvals.services.ledger import decision_record
from jobs.models import Job, JobStep
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.approvals.conftest import paused_on
from tests.conftest import make_user
from waits.models import Wait
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_create

CALLERS = ("anonymous", "other", "revoked", "deactivated", "staff", "owner")
DISCOVER = bool(os.environ.get("ACCESS_MATRIX_DISCOVER"))  # print what each caller gets instead of asserting


# -- the world each row is asked in ------------------------------------------------------------------
@dataclass
class World:
    users: dict[str, Any]
    keys: dict[str, str]
    ids: dict[str, Any] = field(default_factory=dict)

    def client(self, caller: str, owner: str) -> Client:
        client = Client(raise_request_exception=False)
        if caller == "revoked":
            client.defaults["HTTP_AUTHORIZATION"] = f"Token {self.keys['revoked']}"
            return client
        user = self.users[owner] if caller == "owner" else self.users.get(caller)
        if user is not None:
            client.force_login(user)
        if caller == "deactivated":
            type(user).objects.filter(pk=user.pk).update(is_active=False)
            client.defaults["HTTP_AUTHORIZATION"] = f"Token {self.keys['deactivated']}"
        return client


def world_build(number: int = 0) -> World:
    """Users and objects for one row (a `fresh` row builds one per caller, `number` apart). Its
    jobs are run here, in this process: no message goes to a worker an earlier test left running."""
    with mock.patch("jobs.services.transitions.job_dispatch"):
        return _world_build(number)


def _world_build(number: int) -> World:
    creator = make_user(f"olivia{number}")
    users = {
        "creator": creator,
        "reviewer": make_user(f"rita{number}", reviewer=True),
        "superuser": make_user(f"root{number}", superuser=True),
        "other": make_user(f"mallory{number}"),
        "staff": make_user(f"sam{number}", staff=True),
        "deactivated": make_user(f"dora{number}", superuser=True),
    }
    revoked, revoked_key = api_token_create(user=creator, name="old")
    api_token_revoke(token=revoked)
    keys = {"revoked": revoked_key, "deactivated": api_token_create(user=users["deactivated"])[1]}
    webhook = webhook_create(owner=creator, url="https://hooks.example.com/jobs", events=["completed"])
    job, question = paused_on({}, owner=creator)
    done, _ = job_submit(kind="demo.noop", owner=creator)
    job_execute(job_id=done.pk)
    decision = decision_record(question=question, kind=Decision.Kind.REOPENED, channel=Decision.Channel.SYSTEM)
    wait = Wait.objects.create(job=done, key="render", token_salt="salt", token_hash=uuid.uuid4().hex * 2)
    step = JobStep.objects.create(job=done, name="render", result={"frames": 3})
    ids = {
        "job": job.pk, "question": question.pk, "done": done.pk, "webhook": webhook.pk, "decision": decision.pk,
        "delivery": WebhookDelivery.objects.get(job=done).pk, "wait": wait.pk, "token": revoked.pk,
        "user": creator.pk, "group": Group.objects.get(name="reviewers").pk, "step": step.pk,
        "ct": ContentType.objects.get_for_model(Job).pk, "missing": "0" * 32,
    }
    return World(users=users, keys=keys, ids=ids)


# -- the rows -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    route: str                      # the URL pattern, as get_resolver() lists it
    path: str                       # what is asked, with {placeholders} from World.ids
    expect: tuple[int, ...]         # the status for each of CALLERS, in that order
    method: str = "get"
    owner: str = "creator"
    body: dict | None = None
    fresh: bool = False
    committed: bool = False         # asked of the live server (async views read the database from threads)

    @property
    def id(self) -> str:
        return f"{self.method.upper()} {self.route}"


def r(route: str, path: str, *expect: int, **options: Any) -> Row:
    return Row(route=route, path=path, expect=tuple(expect), **options)


#                                                                    anon other revoked deact staff owner
API = [
    r("api/job-kinds/", "/api/job-kinds/",                            401, 200, 401, 401, 200, 200),
    r("api/^jobs/$", "/api/jobs/",                                    401, 200, 401, 401, 200, 200),
    r("api/^jobs/$", "/api/jobs/",                                    401, 201, 401, 401, 201, 201,
      method="post", body={"kind": "demo.noop", "input": {}}),
    r("api/^jobs/(?P<pk>[^/]+)/$", "/api/jobs/{job}/",                401, 404, 401, 401, 200, 200),
    r("api/^jobs/(?P<pk>[^/]+)/cancel/$", "/api/jobs/{job}/cancel/",  401, 404, 401, 401, 200, 200,
      method="post", fresh=True),
    r("api/^jobs/(?P<pk>[^/]+)/retry/$", "/api/jobs/{done}/retry/",   401, 404, 401, 401, 409, 409, method="post"),
    r("api/^jobs/(?P<pk>[^/]+)/events/$", "/api/jobs/{job}/events/",  401, 404, 401, 401, 200, 200),
    r("api/jobs/<str:job_id>/events/stream/", "/api/jobs/{done}/events/stream/",
                                                                      401, 404, 401, 401, 200, 200, committed=True),
    r("api/^questions/$", "/api/questions/",                          401, 200, 401, 401, 200, 200, owner="reviewer"),
    r("api/^questions/(?P<pk>[^/]+)/$", "/api/questions/{question}/", 401, 404, 401, 401, 200, 200, owner="reviewer"),
    r("api/^questions/(?P<pk>[^/]+)/answer/$", "/api/questions/{question}/answer/",
                                                                      401, 404, 401, 401, 403, 200,
      method="post", owner="reviewer", body={"answer": {"approved": True}}, fresh=True),
    r("api/^questions/(?P<pk>[^/]+)/decisions/$", "/api/questions/{question}/decisions/",
                                                                      401, 404, 401, 401, 200, 200, owner="reviewer"),
    r("api/^webhooks/$", "/api/webhooks/",                            401, 200, 401, 401, 200, 200),
    r("api/^webhooks/$", "/api/webhooks/",                            401, 201, 401, 401, 201, 201, method="post",
      body={"url": "https://hooks.example.com/mine", "events": ["failed"]}),
    r("api/^webhooks/(?P<pk>[^/]+)/$", "/api/webhooks/{webhook}/",    401, 404, 401, 401, 404, 200),
    r("api/^webhooks/(?P<pk>[^/]+)/$", "/api/webhooks/{webhook}/",    401, 404, 401, 401, 404, 204,
      method="delete", fresh=True),
    r("api/^webhooks/(?P<pk>[^/]+)/deliveries/$", "/api/webhooks/{webhook}/deliveries/",
                                                                      401, 404, 401, 401, 404, 200),
    # Waits: a job's creator and staff see them; acting on one (a combined wait's person) takes
    # the answer permission and an assignment, as a question does. This wait has no person: the
    # API refuses (403), the pages have nothing to act on (404).
    r("api/^waits/$", "/api/waits/",                                  401, 200, 401, 401, 200, 200),
    r("api/^waits/(?P<pk>[^/]+)/$", "/api/waits/{wait}/",             401, 404, 401, 401, 200, 200),
    r("api/^waits/(?P<pk>[^/]+)/decisions/$", "/api/waits/{wait}/decisions/",
                                                                      401, 404, 401, 401, 200, 200),
    r("api/^waits/(?P<pk>[^/]+)/provide/$", "/api/waits/{wait}/provide/",
                                                                      401, 404, 401, 401, 403, 403,
      method="post", body={"result": {"text": "x"}}),
    r("api/^waits/(?P<pk>[^/]+)/retry/$", "/api/waits/{wait}/retry/", 401, 404, 401, 401, 403, 403, method="post",
      body={}),
    r("api/^waits/(?P<pk>[^/]+)/fail/$", "/api/waits/{wait}/fail/",   401, 404, 401, 401, 403, 403, method="post",
      body={"reason": "gone"}),
    # A ticket for one websocket connection: any signed-in, active caller may ask for one.
    r("api/ws-tickets/", "/api/ws-tickets/",                          401, 201, 401, 401, 201, 201, method="post"),
    # No credential but the token itself (the contract); an unknown token is 404 for everyone.
    r("api/wake/<str:token>/", "/api/wake/{missing}/",                404, 404, 404, 404, 404, 404, method="post"),
    # Public by decision (README, "Security"): the API's description, no data.
    # A credential that is offered must be good, even where none is needed.
    r("api/schema/", "/api/schema/",                                  200, 200, 401, 401, 200, 200),
    r("api/docs/", "/api/docs/",                                      200, 200, 401, 401, 200, 200),
]

PAGES = [
    r("jobs/", "/jobs/",                                              302, 200, 302, 302, 200, 200),
    # Any signed-in user may submit, as through the API; this body is refused by the form (400).
    r("jobs/submit/", "/jobs/submit/",                                302, 400, 302, 302, 400, 400,
      method="post", body={"kind": "test.ask", "input_json": "[]"}),
    r("jobs/<uuid:job_id>/", "/jobs/{job}/",                          302, 404, 302, 302, 200, 200),
    r("jobs/<uuid:job_id>/panel/", "/jobs/{job}/panel/",              302, 404, 302, 302, 200, 200),
    r("jobs/<uuid:job_id>/questions/<uuid:question_id>/answer/", "/jobs/{job}/questions/{question}/answer/",
                                                                      302, 404, 302, 302, 302, 302,
      method="post", owner="reviewer", body={"_approve": "1"}, fresh=True),
    r("jobs/<uuid:job_id>/waits/<int:wait_id>/act/", "/jobs/{done}/waits/{wait}/act/",
                                                                      302, 404, 302, 302, 404, 404,
      method="post", body={}),
]

OPERATIONS = [
    # Probes answer everyone (a status only; the detail: tests/security/test_health_detail.py).
    r("healthz", "/healthz",                                          200, 200, 200, 200, 200, 200),
    r("readyz", "/readyz",                                            503, 503, 503, 503, 503, 503),
    r("metrics", "/metrics",                                          401, 403, 401, 401, 200, 200, owner="superuser"),
    r("ops/", "/ops/",                                                302, 403, 302, 302, 200, 200, owner="superuser"),
    r("ops/data/", "/ops/data/",                                      302, 403, 302, 302, 200, 200, owner="superuser"),
]

# The simulated generation service of demo.generate (demo code; production settings leave it out).
DEMO = [
    r("sim/generate/", "/sim/generate/",                              400, 400, 400, 400, 400, 400, method="post"),
    r("sim/generate/<str:gen_id>/", "/sim/generate/{missing}/",       404, 404, 404, 404, 404, 404),
]

# The admin: its own pages, then each registered model's standard pages (generated below).
ADMIN = [
    r("admin/login/", "/admin/login/",                                200, 200, 200, 200, 302, 302, owner="superuser"),
    r("admin/", "/admin/",                                            302, 302, 302, 302, 200, 200, owner="superuser"),
    r("admin/logout/", "/admin/logout/",                              302, 302, 302, 302, 200, 200,
      method="post", owner="superuser"),
    r("admin/password_change/", "/admin/password_change/",            302, 302, 302, 302, 200, 200, owner="superuser"),
    r("admin/password_change/done/", "/admin/password_change/done/",  302, 302, 302, 302, 200, 200, owner="superuser"),
    r("admin/autocomplete/", "/admin/autocomplete/?app_label=accounts&model_name=apitoken&field_name=user",
                                                                      302, 302, 302, 302, 403, 200, owner="superuser"),
    r("admin/jsi18n/", "/admin/jsi18n/",                              302, 302, 302, 302, 200, 200, owner="superuser"),
    r("admin/r/<path:content_type_id>/<path:object_id>/", "/admin/r/{ct}/{job}/",
                                                                      302, 302, 302, 302, 404, 404, owner="superuser"),
    r("admin/^(?P<app_label>auth|accounts|approvals|waits|jobs|webhooks)/$", "/admin/jobs/",
                                                                      302, 302, 302, 302, 404, 200, owner="superuser"),
    r("admin/waits/wait/<int:wait_id>/act/", "/admin/waits/wait/{wait}/act/",
                                                                      302, 302, 302, 302, 404, 404, method="post",
      owner="superuser"),
    r("admin/(?P<url>.*)$", "/admin/no-such-page/",                   302, 302, 302, 302, 404, 404, owner="superuser"),
    r("admin/auth/user/<id>/password/", "/admin/auth/user/{user}/password/",
                                                                      302, 302, 302, 302, 403, 200, owner="superuser"),
    # Staff without the answer permission are refused by the answering service, and told why on the
    # question's page (a redirect, as for any answer): tests/approvals/test_admin.py.
    r("admin/approvals/question/<path:object_id>/answer/", "/admin/approvals/question/{question}/answer/",
                                                                      302, 302, 302, 302, 302, 302,
      method="post", owner="reviewer", body={"_approve": "1"}, fresh=True),
    r("admin/waits/wait/<int:wait_id>/check-now/", "/admin/waits/wait/{wait}/check-now/",
                                                                      302, 302, 302, 302, 403, 302,
      method="post", owner="superuser", fresh=True),
    r("admin/waits/wait/<int:wait_id>/cancel/", "/admin/waits/wait/{wait}/cancel/",
                                                                      302, 302, 302, 302, 403, 302,
      method="post", owner="superuser", fresh=True),
]

# Each registered model's standard admin pages: who may see them is the model's permissions; the
# statuses of a superuser differ only where the admin refuses a page to everyone (a read-only model).
ADMIN_OBJECTS = {"auth.group": "group", "auth.user": "user", "accounts.apitoken": "token",
                 "approvals.decision": "decision", "approvals.question": "question", "waits.wait": "wait",
                 "jobs.job": "done", "jobs.jobstep": "step", "webhooks.webhook": "webhook",
                 "webhooks.webhookdelivery": "delivery"}
SUPERUSER_REFUSED = {  # (model, page): what a superuser gets where the admin allows nobody
    ("approvals.decision", "add"): 403, ("approvals.decision", "delete"): 403,  # the ledger is append-only
    ("approvals.question", "add"): 403, ("approvals.question", "delete"): 403,  # jobs ask questions
    ("waits.wait", "add"): 403, ("waits.wait", "delete"): 403,                  # jobs park on waits
    ("webhooks.webhookdelivery", "add"): 403,                                    # status changes queue them
    ("webhooks.webhook", "add"): 403,                                            # owners register through the API
    ("jobs.jobstep", "add"): 403, ("jobs.jobstep", "delete"): 403,              # runs write them; gone with the job
    # Not a refusal: the steps' list is one job's (`?job__id__exact=`); without a job it sends a
    # superuser to the jobs' list (tests/jobs/test_admin_page.py).
    ("jobs.jobstep", "changelist"): 302,
}


def admin_model_rows() -> list[Row]:
    rows = []
    for model in admin.site._registry:
        label = model._meta.label_lower
        base = f"admin/{model._meta.app_label}/{model._meta.model_name}/"
        url = f"/{base}"
        obj = "{" + ADMIN_OBJECTS[label] + "}"
        for page, route, path, ok in [
            ("changelist", base, url, 200),
            ("add", f"{base}add/", f"{url}add/", 200),
            ("history", f"{base}<path:object_id>/history/", f"{url}{obj}/history/", 200),
            ("delete", f"{base}<path:object_id>/delete/", f"{url}{obj}/delete/", 200),
            ("change", f"{base}<path:object_id>/change/", f"{url}{obj}/change/", 200),
            ("redirect", f"{base}<path:object_id>/", f"{url}{obj}/", 302),
        ]:
            # The bare object URL redirects to its change page before anything is checked.
            owner_status = 302 if page == "redirect" else SUPERUSER_REFUSED.get((label, page), ok)
            staff_status = 302 if page == "redirect" else 403
            rows.append(r(route, path, 302, 302, 302, 302, staff_status, owner_status, owner="superuser"))
    return rows


ROWS = [*API, *PAGES, *OPERATIONS, *DEMO, *ADMIN, *admin_model_rows()]


def url_patterns() -> set[str]:
    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern)

    return set(walk(get_resolver().url_patterns))


def normalized(route: str) -> str:
    """The admin's app-index route lists the app labels in the order the apps registered models
    (which follows imports): compare them as a set."""
    return re.sub(r"\(\?P<app_label>([^)]*)\)", lambda m: "(?P<app_label>" + "|".join(sorted(m[1].split("|"))) + ")",
                  route)


def test_every_route_has_a_row():
    routes, covered = {normalized(r) for r in url_patterns()}, {normalized(row.route) for row in ROWS}
    assert not routes - covered, f"routes without a row in the access matrix: {sorted(routes - covered)}"
    assert not covered - routes, f"rows for routes that no longer exist: {sorted(covered - routes)}"


def ask_server(server: str, client: Client, row: Row, path: str) -> int:
    """Ask the live ASGI server, with the client's cookies and headers (rows marked `committed`)."""
    token = client.defaults.get("HTTP_AUTHORIZATION")
    headers = {"Authorization": token} if token else {}
    cookies = {name: morsel.value for name, morsel in client.cookies.items()}
    with httpx.Client(base_url=server, cookies=cookies, headers=headers, timeout=30) as http:
        with http.stream(row.method.upper(), path, json=row.body) as response:
            response.read()  # the SSE stream of a finished job ends by itself
            return response.status_code


def ask(world: World, row: Row, caller: str, server: str | None = None) -> int:
    client = world.client(caller, row.owner)
    path = row.path.format(**world.ids)
    if server is not None:
        return ask_server(server, client, row, path)
    call = getattr(client, row.method)
    if row.body is not None and row.route.startswith("api/"):
        response = call(path, data=json.dumps(row.body), content_type="application/json")
    elif row.body is not None:
        response = call(path, data=row.body)
    else:
        response = call(path)
    return response.status_code


def row_param(row: Row):
    marks = [pytest.mark.django_db(transaction=True)] if row.committed else [pytest.mark.django_db]
    return pytest.param(row, id=f"{row.id} {row.path}", marks=marks)


@pytest.mark.parametrize("row", [row_param(row) for row in ROWS])
def test_each_caller_gets_the_status_of_its_row(row, settings, request):
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = False
    # Async views (the SSE stream) read the database from threads of their own: they are asked of
    # the live ASGI server, on committed rows.
    server = request.getfixturevalue("server") if row.committed else None
    got = {}
    world = world_build()
    for number, caller in enumerate(CALLERS):
        if row.fresh and number:
            world = world_build(number)
        got[caller] = ask(world, row, caller, server)
        if caller == "deactivated":
            type(world.users["deactivated"]).objects.filter(pk=world.users["deactivated"].pk).update(is_active=True)
    observed = tuple(got[caller] for caller in CALLERS)
    if DISCOVER:
        print(f"\nMATRIX {row.id} {row.path} {observed}")
        return
    assert observed == row.expect, dict(zip(CALLERS, observed, strict=True))


# -- websockets: the live event stream and the feed -------------------------------------------------------
@dataclass(frozen=True)
class SocketRow:
    route: str
    path: str
    expect: tuple[str, ...]  # "open", or the close code, for each of CALLERS


WS_ROWS = [
    #                                                         anon    other   revoked deact   staff   owner
    SocketRow("ws/jobs/<str:job_id>/", "/ws/jobs/{job}/?after=0", ("4403", "4403", "4403", "4403", "open", "open")),
    SocketRow("ws/jobs/", "/ws/jobs/",                            ("4403", "open", "4403", "4403", "open", "open")),
]


def test_every_websocket_route_has_a_row():
    from taskplatform.routing import websocket_urlpatterns

    assert {str(pattern.pattern) for pattern in websocket_urlpatterns} == {row.route for row in WS_ROWS}


async def socket_outcome(path: str, client: Client) -> str:
    from taskplatform.asgi import application

    headers = [(b"origin", b"http://testserver")]
    cookies = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    if cookies:
        headers.append((b"cookie", cookies.encode()))
    if "HTTP_AUTHORIZATION" in client.defaults:
        headers.append((b"authorization", client.defaults["HTTP_AUTHORIZATION"].encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    try:
        if not connected:
            return "refused"
        if await communicator.receive_nothing(timeout=1):
            return "open"  # accepted, nothing to say yet (the feed)
        message = await communicator.receive_output(timeout=5)
        if message["type"] == "websocket.close":
            return str(message.get("code"))
        return "open"
    finally:
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("row", WS_ROWS, ids=[row.route for row in WS_ROWS])
def test_each_caller_gets_the_websocket_outcome_of_its_row(row):
    world = world_build()
    got = {}
    for caller in CALLERS:
        client = world.client(caller, "creator")
        # async_to_sync, not asyncio.run: the consumer's database calls then run in this thread, on
        # the test's connection, instead of leaving one open in a thread of their own.
        got[caller] = async_to_sync(socket_outcome)(row.path.format(**world.ids), client)
        if caller == "deactivated":
            type(world.users["deactivated"]).objects.filter(pk=world.users["deactivated"].pk).update(is_active=True)
    observed = tuple(got[caller] for caller in CALLERS)
    if DISCOVER:
        print(f"\nMATRIX-WS {row.route} {observed}")
        return
    assert observed == row.expect, dict(zip(CALLERS, observed, strict=True))
