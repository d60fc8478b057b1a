"""Item 8's smaller items: escaped help text, CSV cells that cannot run as formulas, password
validators, and a throttle on the admin's sign-in."""

from __future__ import annotations

import csv
import io
import uuid

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client

from approvals.admin.decisions import decisions_csv
from approvals.models import Decision
from approvals.services import question_answer
from tests.approvals.conftest import paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

PAYLOAD = '<img src=x onerror="alert(1)">'


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# -- help text ------------------------------------------------------------------------------------
def test_a_schema_description_is_escaped_where_it_is_shown_as_help_text():
    schema = {"type": "object", "properties": {"amount": {"type": "number", "description": PAYLOAD}}}
    job, question = paused_on({"schema": schema})
    client = signed_in(make_user("boss", superuser=True))
    for path in (f"/jobs/{job.pk}/", f"/admin/approvals/question/{question.pk}/change/"):
        page = client.get(path).content.decode()
        assert PAYLOAD not in page, path
        assert "&lt;img src=x" in page, path


# -- CSV export -----------------------------------------------------------------------------------
@pytest.mark.parametrize("comment", ["=HYPERLINK(\"http://evil.example\",\"x\")", "+1+1", "-2+3", "@SUM(A1)",
                                     "\t=1", "\r=1"])
def test_csv_cells_that_could_run_as_formulas_are_neutralised(reviewer, comment):
    _, question = paused_on({})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True}, comment=comment, channel="api")
    response = decisions_csv(Decision.objects.filter(question=question), filename="x.csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    cell = rows[-1]["comment"]
    assert cell == "'" + comment, cell


def test_csv_cells_that_are_plain_stay_as_they_were(reviewer):
    _, question = paused_on({})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True}, comment="fine -- ok",
                    channel="api")
    response = decisions_csv(Decision.objects.filter(question=question), filename="x.csv")
    row = list(csv.DictReader(io.StringIO(response.content.decode())))[-1]
    assert row["comment"] == "fine -- ok" and row["answer"] == '{"approved": true}'


# -- passwords ------------------------------------------------------------------------------------
@pytest.mark.parametrize("password", ["password123", "qwertyuiop", "80412345678"])
def test_common_and_numeric_passwords_are_refused(password):
    with pytest.raises(ValidationError):
        validate_password(password)


def test_a_good_password_passes():
    validate_password("correct horse battery staple 7")


# -- admin sign-in throttle -------------------------------------------------------------------------
def attempt(username: str, password: str, address: str) -> tuple[int, Client]:
    client = Client(REMOTE_ADDR=address)
    response = client.post("/admin/login/?next=/admin/", {"username": username, "password": password})
    return response.status_code, client


def signed_in_as(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def test_repeated_failed_sign_ins_lock_that_name_from_that_address(settings):
    name = f"boss{uuid.uuid4().hex[:6]}"
    make_user(name, superuser=True)
    address = "198.51.100.20"
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        status, _ = attempt(name, "wrong", address)
        assert status == 200  # the form again, with its error
    status, client = attempt(name, name, address)  # the right password, too late
    assert status == 429 and not signed_in_as(client)
    assert b"Too many failed sign-ins" in client.post("/admin/login/", {"username": name, "password": name}).content
    status, other = attempt(name, name, "198.51.100.21")  # another address is not locked out
    assert status == 302 and signed_in_as(other)


def test_one_address_trying_many_names_is_locked_too(settings):
    address = "198.51.100.30"
    for number in range(settings.LOGIN_FAILURE_LIMIT * 4):
        attempt(f"guess{number}-{uuid.uuid4().hex[:4]}", "wrong", address)
    name = f"boss{uuid.uuid4().hex[:6]}"
    make_user(name, superuser=True)
    status, client = attempt(name, name, address)
    assert status == 429 and not signed_in_as(client)


def test_a_successful_sign_in_clears_the_failures(settings):
    name = f"boss{uuid.uuid4().hex[:6]}"
    make_user(name, superuser=True)
    address = "198.51.100.40"
    for _ in range(settings.LOGIN_FAILURE_LIMIT - 1):
        attempt(name, "wrong", address)
    assert attempt(name, name, address)[0] == 302
    for _ in range(settings.LOGIN_FAILURE_LIMIT - 1):
        attempt(name, "wrong", address)
    assert attempt(name, name, address)[0] == 302
