"""accounts.backends.ModelBackend: Django's permission rules, read in one query.

Every answer, inbox and admin page asks `has_perm`; Django's own backend reads the user's
permissions and their groups' in two queries. Ours reads both at once and must say exactly
what Django's says."""

from __future__ import annotations

import pytest
from django.contrib.auth.backends import ModelBackend as DjangoModelBackend
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.backends import ModelBackend
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def _fresh(user):
    return type(user).objects.get(pk=user.pk)  # no permission cache


def _perm(codename: str) -> Permission:
    return Permission.objects.get(codename=codename)


def test_the_backend_is_the_one_configured(settings):
    assert settings.AUTHENTICATION_BACKENDS == ["accounts.backends.ModelBackend"]


def test_own_and_group_permissions_in_one_query_and_the_same_as_djangos():
    group = Group.objects.create(name="answerers")
    group.permissions.add(_perm("answer_question"), _perm("view_question"))
    user = make_user("mixed")
    user.groups.add(group)
    user.user_permissions.add(_perm("view_job"), _perm("view_question"))  # one also held through the group

    fresh = _fresh(user)
    with CaptureQueriesContext(connection) as queries:
        ours = ModelBackend().get_all_permissions(fresh)
    assert len(queries) == 1, [query["sql"] for query in queries]
    assert ours == DjangoModelBackend().get_all_permissions(_fresh(user))
    assert {"approvals.answer_question", "approvals.view_question", "jobs.view_job"} <= ours

    fresh = _fresh(user)
    with CaptureQueriesContext(connection) as queries:
        assert fresh.has_perm("approvals.answer_question")
        assert fresh.has_perm("jobs.view_job")
        assert not fresh.has_perm("approvals.delete_question")
    assert len(queries) == 1, "the permissions are read once per user object (per request)"


@pytest.mark.parametrize("case", ["no permissions", "inactive", "superuser"])
def test_the_edges_agree_with_djangos(case):
    user = make_user(case.replace(" ", "-"), superuser=case == "superuser")
    if case == "inactive":
        user.user_permissions.add(_perm("answer_question"))
        user.is_active = False
        user.save()
    ours = ModelBackend().get_all_permissions(_fresh(user))
    assert ours == DjangoModelBackend().get_all_permissions(_fresh(user))
    assert bool(ours) == (case == "superuser")


def test_a_permission_taken_away_applies_to_the_next_request():
    group = Group.objects.create(name="answerers")
    group.permissions.add(_perm("answer_question"))
    user = make_user("leaver")
    user.groups.add(group)
    assert _fresh(user).has_perm("approvals.answer_question")
    user.groups.remove(group)
    assert not _fresh(user).has_perm("approvals.answer_question")
