"""API tokens: the `create_api_token` command, hashing at rest, last use, and revoking (also from
the admin)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from accounts.models import ApiToken
from accounts.services import api_token_create, api_token_revoke, token_hash
from jobs.models import Job

pytestmark = pytest.mark.django_db


def create_api_token(*args: str) -> list[str]:
    out = StringIO()
    call_command("create_api_token", *args, stdout=out)
    return out.getvalue().strip().splitlines()


def token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_create_makes_the_user_and_prints_a_working_token_on_the_last_line():
    lines = create_api_token("integration", "--create")
    key = lines[-1]
    assert "created user integration" in lines[0]
    user = get_user_model().objects.get(username="integration")
    assert not user.groups.filter(name="reviewers").exists()
    response = token_client(key).post("/api/jobs/", {"kind": "demo.noop"}, format="json")
    assert response.status_code == 201
    assert ApiToken.objects.get(user=user).last_used_at is not None


def test_the_key_is_stored_only_as_its_hash():
    key = create_api_token("integration", "--create")[-1]
    token = ApiToken.objects.get(user__username="integration")
    assert token.key_hash == token_hash(key) and key not in (token.key_hash, token.prefix)
    assert token.prefix == key[:8]


def test_reviewer_flag_adds_the_user_to_reviewers(paused_review):
    _, question = paused_review
    key = create_api_token("desk2", "--create", "--reviewer")[-1]
    assert get_user_model().objects.get(username="desk2").groups.filter(name="reviewers").exists()
    response = token_client(key).post(f"/api/questions/{question.pk}/answer/", {"answer": {"approved": True}},
                                      format="json")
    assert response.status_code == 200


def test_an_unknown_user_without_create_is_an_error():
    with pytest.raises(CommandError, match="--create"):
        create_api_token("nobody")


def test_a_second_token_for_an_existing_user(submitter):
    lines = create_api_token("submitter", "--name", "ci")
    assert len(lines) == 1
    assert ApiToken.objects.get(user=submitter).name == "ci"


def test_a_revoked_token_gets_401():
    key = create_api_token("integration", "--create")[-1]
    assert token_client(key).get("/api/jobs/").status_code == 200
    api_token_revoke(token=ApiToken.objects.get(user__username="integration"))
    response = token_client(key).get("/api/jobs/")
    assert response.status_code == 401 and response.json()["code"] == "authentication_failed"


def test_an_inactive_users_token_gets_401(submitter):
    _, key = api_token_create(user=submitter)
    submitter.is_active = False
    submitter.save()
    assert token_client(key).get("/api/jobs/").status_code == 401


def test_the_token_lookup_is_built_once_and_each_request_finds_its_own_token(monkeypatch, settings, submitter):
    """Every API request looks its token up with the statement the ORM built once for the
    connection (accounts.services._token_active): no query building per request, and each
    request still gets its own token's user, never the one the statement was built for."""
    from django.db.models.sql.compiler import SQLCompiler

    other = get_user_model().objects.create_user("other-submitter")
    settings.KEPT_READS_CHECK = False  # that check builds every read through the ORM as well
    keys = {submitter.username: api_token_create(user=submitter)[1], other.username: api_token_create(user=other)[1]}
    assert token_client(keys["submitter"]).get("/api/jobs/").status_code == 200  # builds it, if not yet
    built = []
    as_sql = SQLCompiler.as_sql

    def counting(compiler, *args, **kwargs):
        if compiler.query.model is ApiToken:
            built.append(compiler.query)
        return as_sql(compiler, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", counting)
    for name in ["other-submitter", "submitter", "other-submitter"]:
        response = token_client(keys[name]).post("/api/jobs/", {"kind": "demo.noop", "input": {}}, format="json")
        assert response.status_code == 201, response.content
        assert Job.objects.get(pk=response.json()["id"]).owner.username == name
    assert token_client("not-a-key").get("/api/jobs/").status_code == 401
    assert built == []


# -- the admin -----------------------------------------------------------------------------------
def test_the_admin_lists_tokens_by_prefix_and_never_their_hash(client, superuser, submitter):
    token, key = api_token_create(user=submitter, name="deploy")
    client.force_login(superuser)
    page = client.get("/admin/accounts/apitoken/").content.decode()
    assert token.prefix in page and "deploy" in page and "submitter" in page
    assert token.key_hash not in page and key not in page
    detail = client.get(f"/admin/accounts/apitoken/{token.pk}/change/").content.decode()
    assert token.key_hash not in detail


def test_the_admin_revokes_selected_tokens(client, superuser, submitter):
    token, key = api_token_create(user=submitter)
    kept, _ = api_token_create(user=submitter)
    client.force_login(superuser)
    response = client.post(
        "/admin/accounts/apitoken/", {"action": "revoke_selected", "_selected_action": [token.pk]}, follow=True
    )
    assert "Revoked 1 token(s)" in response.content.decode()
    token.refresh_from_db()
    kept.refresh_from_db()
    assert token.revoked_at is not None and kept.revoked_at is None
    assert token_client(key).get("/api/jobs/").status_code == 401


def test_a_token_made_in_the_admin_shows_its_key_once(client, superuser, submitter):
    client.force_login(superuser)
    response = client.post("/admin/accounts/apitoken/add/", {"user": submitter.pk, "name": "from admin"}, follow=True)
    page = response.content.decode()
    token = ApiToken.objects.get(name="from admin")
    shown = page.split("is: ", 1)[1].split(" ", 1)[0]
    assert token.key_hash == token_hash(shown)
    assert token_client(shown).get("/api/jobs/").status_code == 200
    assert shown not in client.get(f"/admin/accounts/apitoken/{token.pk}/change/").content.decode()
