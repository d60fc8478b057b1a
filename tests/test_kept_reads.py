"""dbkit.kept: a read built by the ORM once per connection gives what its queryset gives."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import BooleanField, ExpressionWrapper
from django.db.models.sql.compiler import SQLCompiler

from accounts.models import ApiToken
from accounts.services import api_token_create
from dbkit.kept import KeptRead

pytestmark = pytest.mark.django_db


def by_owner(owner_id):
    return ApiToken.objects.select_related("user").filter(user_id=owner_id).order_by("name")


def test_the_rows_are_the_querysets_own_with_their_related_rows(monkeypatch, settings, django_assert_num_queries):
    settings.KEPT_READS_CHECK = False  # that check builds every read through the ORM as well
    User = get_user_model()
    ann, bob = User.objects.create_user("ann"), User.objects.create_user("bob")
    for name in ["b", "a", "c"]:
        api_token_create(user=ann, name=name)
    api_token_create(user=bob, name="z")
    read = KeptRead(by_owner, stand_ins=(-1,))
    assert read.rows(bob.pk, using="default")[0].name == "z"  # built here, once
    compiled = []
    as_sql, get_converters = SQLCompiler.as_sql, SQLCompiler.get_converters
    monkeypatch.setattr(SQLCompiler, "as_sql",
                        lambda compiler, *args, **kwargs: compiled.append(1) or as_sql(compiler, *args, **kwargs))
    # Nor are its columns' converters worked out again (a tenth of an answer's reads).
    monkeypatch.setattr(SQLCompiler, "get_converters", lambda compiler, *args, **kwargs: compiled.append(2)
                        or get_converters(compiler, *args, **kwargs))
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


@pytest.mark.django_db(transaction=True)  # the other thread's connection sees the rows
def test_a_read_built_in_one_thread_is_not_built_again_in_another(monkeypatch, settings):
    """A web process hands its requests round a pool of threads, each with a connection of its
    own: what one thread's built, the others take (dbkit.per_connection). Each built it again at
    its first request of a kind, some 15 ms of an answer's."""
    settings.KEPT_READS_CHECK = False
    ann = get_user_model().objects.create_user("ann")
    for name in ["b", "a"]:
        api_token_create(user=ann, name=name)
    read = KeptRead(by_owner, stand_ins=(-1,))
    assert [t.name for t in read.rows(ann.pk, using="default")] == ["a", "b"]
    compiled = []
    as_sql = SQLCompiler.as_sql
    monkeypatch.setattr(SQLCompiler, "as_sql",
                        lambda compiler, *args, **kwargs: compiled.append(1) or as_sql(compiler, *args, **kwargs))

    def in_another_thread() -> tuple[list, object]:
        try:
            return [(t.name, t.user.username) for t in read.rows(ann.pk, using="default")], connections["default"]
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        rows, others = pool.submit(in_another_thread).result()
    assert others is not connections["default"]  # a connection of its own
    assert rows == [("a", "ann"), ("b", "ann")] and compiled == []


def test_what_is_forgotten_is_built_again_in_every_thread(monkeypatch, settings):
    from dbkit.per_connection import forget, once_per_connection

    built = []
    connection = connections["default"]
    key = "_tests_kept_once"
    try:
        assert once_per_connection(connection, key, lambda: built.append(1) or "first") == "first"
        assert once_per_connection(connection, key, lambda: built.append(2) or "second") == "first"
        with ThreadPoolExecutor(max_workers=1) as pool:
            assert pool.submit(once_per_connection, connections["default"], key, lambda: "other").result() == "first"
        forget(connection, key)
        assert once_per_connection(connection, key, lambda: built.append(3) or "third") == "third"
        assert built == [1, 3]
    finally:
        forget(connection, key)


def test_a_stand_in_that_is_not_a_parameter_of_its_own_is_refused_with_the_statement():
    unused = KeptRead(lambda value: ApiToken.objects.all(), stand_ins=("unused",))
    with pytest.raises(ValueError, match="must be a parameter of its own"):
        unused.rows("x", using="default")
    shared = KeptRead(lambda a, b: ApiToken.objects.filter(name=a, prefix=b), stand_ins=("same", "same"))
    with pytest.raises(ValueError, match="must be a parameter of its own"):
        shared.rows("x", "y", using="default")


def test_a_value_in_several_places_and_a_uuid_take_each_reads_own(submitter):
    """The user's id twice (two subqueries), a UUID primary key, on this database's own forms."""
    from approvals.models import Question
    from approvals.selectors import assigned_to
    from tests.approvals.conftest import paused_on

    _, question = paused_on({})
    question.assigned_users.add(submitter)
    read = KeptRead(lambda question_id, user_id: Question.objects.filter(pk=question_id).annotate(
        mine=ExpressionWrapper(assigned_to(get_user_model()(pk=user_id)), output_field=BooleanField())),
        stand_ins=(uuid.UUID(int=0), -1))
    other = get_user_model().objects.create_user("other")
    assert [(q.pk, q.mine) for q in read.rows(question.pk, submitter.pk, using="default")] == [(question.pk, True)]
    assert [(q.pk, q.mine) for q in read.rows(str(question.pk), other.pk, using="default")] == [(question.pk, False)]
    assert read.rows(uuid.uuid4(), submitter.pk, using="default") == []


def test_under_the_test_settings_a_read_that_is_not_the_orms_fails():
    """`KEPT_READS_CHECK` (on in the test settings) builds every read through the ORM too: a
    build whose statement depends on more than its values (here a list that changes) is caught."""
    names = ["a"]
    read = KeptRead(lambda prefix: ApiToken.objects.filter(prefix=prefix, name__in=list(names)), stand_ins=("p",))
    assert read.rows("x", using="default") == []
    names.append("b")
    with pytest.raises(AssertionError, match="differs from the ORM's"):
        read.rows("x", using="default")


def test_a_new_read_never_takes_a_freed_ones_statement():
    """Each read keeps its statement under a key of its own for its whole life: a read made after
    another was freed (which may get its memory, so its id) builds its own."""
    numbers = KeptRead(lambda user_id: ApiToken.objects.filter(user_id=user_id), stand_ins=(-1,))
    assert numbers.rows(1, using="default") == []
    del numbers
    names = KeptRead(lambda name: ApiToken.objects.filter(name=name), stand_ins=("stand-in",))
    assert names.rows("a name", using="default") == []
