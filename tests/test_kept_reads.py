"""dbkit.kept: a read built by the ORM once per connection gives what its queryset gives."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db.models.sql.compiler import SQLCompiler

from accounts.models import ApiToken
from accounts.services import api_token_create
from dbkit.kept import KeptRead

pytestmark = pytest.mark.django_db


def by_owner(owner_id):
    return ApiToken.objects.select_related("user").filter(user_id=owner_id).order_by("name")


def test_the_rows_are_the_querysets_own_with_their_related_rows(monkeypatch, django_assert_num_queries):
    User = get_user_model()
    ann, bob = User.objects.create_user("ann"), User.objects.create_user("bob")
    for name in ["b", "a", "c"]:
        api_token_create(user=ann, name=name)
    api_token_create(user=bob, name="z")
    read = KeptRead(by_owner, stand_in=-1)
    assert read.rows(bob.pk, using="default")[0].name == "z"  # built here, once
    compiled = []
    as_sql = SQLCompiler.as_sql
    monkeypatch.setattr(SQLCompiler, "as_sql",
                        lambda compiler, *args, **kwargs: compiled.append(1) or as_sql(compiler, *args, **kwargs))
    rows = read.rows(ann.pk, using="default")
    assert compiled == []
    monkeypatch.undo()
    expected = list(by_owner(ann.pk))
    assert [(t.pk, t.name, t.created_at, t.key_hash) for t in rows] == [
        (t.pk, t.name, t.created_at, t.key_hash) for t in expected]
    assert [t.name for t in rows] == ["a", "b", "c"]
    assert all(t.user.username == "ann" and not t._state.adding for t in rows)
    with django_assert_num_queries(0):
        assert rows[0].user.pk == ann.pk  # the joined user came with the row
    assert read.rows(10**9, using="default") == []


def test_a_stand_in_that_is_not_one_parameter_is_refused_with_the_statement():
    read = KeptRead(lambda value: ApiToken.objects.filter(name=value, prefix=value), stand_in="same")
    with pytest.raises(ValueError, match="must be one parameter"):
        read.rows("x", using="default")

