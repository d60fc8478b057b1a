"""Item 4: the token admin lets nobody impersonate anyone. Staff with `add_apitoken` make keys for
themselves only, superusers for anyone; revoking needs the change permission; every admin action
of the project declares the permissions it needs, and none that acts is open to view-only staff."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import Client

from accounts.models import ApiToken
from accounts.services import api_token_create
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def staff_with(username: str, *codenames: str):
    user = make_user(username, staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="accounts", codename__in=codenames))
    return user


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_staff_with_add_permission_cannot_make_a_key_for_a_superuser():
    root = make_user("root", superuser=True)
    clerk = staff_with("clerk", "add_apitoken", "view_apitoken")
    client = signed_in(clerk)
    form = client.get("/admin/accounts/apitoken/add/").content.decode()
    assert 'name="user"' not in form  # no choice of user: the key is theirs
    response = client.post("/admin/accounts/apitoken/add/", {"user": root.pk, "name": "mine now"}, follow=True)
    assert response.status_code == 200
    assert not ApiToken.objects.filter(user=root).exists()
    token = ApiToken.objects.get(name="mine now")
    assert token.user == clerk  # the posted user was ignored


def test_a_superuser_may_make_a_key_for_another_user():
    make_user("root", superuser=True)
    other = make_user("integration")
    client = signed_in(make_user("boss", superuser=True))
    assert 'name="user"' in client.get("/admin/accounts/apitoken/add/").content.decode()
    client.post("/admin/accounts/apitoken/add/", {"user": other.pk, "name": "for integration"}, follow=True)
    assert ApiToken.objects.get(name="for integration").user == other


def test_view_only_staff_cannot_revoke_tokens():
    owner = make_user("integration")
    token, _ = api_token_create(user=owner)
    client = signed_in(staff_with("auditor", "view_apitoken"))
    page = client.get("/admin/accounts/apitoken/").content.decode()
    assert "revoke_selected" not in page
    client.post("/admin/accounts/apitoken/", {"action": "revoke_selected", "_selected_action": [token.pk]},
                follow=True)
    token.refresh_from_db()
    assert token.revoked_at is None


def test_staff_with_change_permission_may_revoke_tokens():
    token, _ = api_token_create(user=make_user("integration"))
    client = signed_in(staff_with("keeper", "view_apitoken", "change_apitoken"))
    client.post("/admin/accounts/apitoken/", {"action": "revoke_selected", "_selected_action": [token.pk]},
                follow=True)
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_every_admin_action_declares_its_permissions():
    undeclared = []
    for model, model_admin in admin.site._registry.items():
        for action in model_admin.actions or ():
            function = getattr(model_admin, action) if isinstance(action, str) else action
            if not getattr(function, "allowed_permissions", None):
                undeclared.append(f"{model._meta.label}.{getattr(function, '__name__', action)}")
    assert not undeclared, f"admin actions without declared permissions: {undeclared}"


def test_view_only_staff_cannot_send_webhook_deliveries_again(settings):
    from django.contrib.auth.models import Permission as Perm

    from jobs.runner import job_execute
    from jobs.services import job_submit
    from webhooks.models import WebhookDelivery
    from webhooks.services import webhook_create

    owner = make_user("shop")
    webhook_create(owner=owner, url="https://hooks.example.com/x", events=["completed"])
    job, _ = job_submit(kind="demo.noop", owner=owner)
    job_execute(job_id=job.pk)
    WebhookDelivery.objects.update(status="failed", attempts=8)
    viewer = make_user("viewer", staff=True)
    viewer.user_permissions.add(Perm.objects.get(codename="view_webhookdelivery"))
    client = signed_in(viewer)
    assert "retry_now" not in client.get("/admin/webhooks/webhookdelivery/").content.decode()
    delivery = WebhookDelivery.objects.get()
    client.post("/admin/webhooks/webhookdelivery/", {"action": "retry_now", "_selected_action": [delivery.pk]})
    delivery.refresh_from_db()
    assert delivery.status == "failed"
