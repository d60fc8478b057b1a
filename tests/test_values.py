"""`dbkit.values.save_preparer` gives what the field's `get_db_prep_save` gives, for any value;
`lookup_preparer` what an `exact` lookup on the field sends."""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta, timezone

import pytest
from django.db import connection
from django.db.models import (
    BigIntegerField,
    CharField,
    DateTimeField,
    F,
    IntegerField,
    JSONField,
    PositiveIntegerField,
    SmallIntegerField,
    TextField,
    UUIDField,
    Value,
)
from django.utils.functional import lazy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbkit.values import _comparable, lookup_preparer, prepared_checked, save_preparer

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(st.text(max_size=3), children, max_size=3), max_leaves=6)
values = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.booleans(),
    st.none(),
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=3)), None])),
    json_values,
    st.sampled_from([F("status"), Value("x"), Value(None, JSONField()), lazy(lambda: "lazy", str)()]),
)
FIELDS = [CharField(max_length=20), TextField(), DateTimeField(), JSONField(), IntegerField(), PositiveIntegerField(),
          SmallIntegerField(), BigIntegerField()]


class _Str(str):
    pass


@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime")
@pytest.mark.parametrize("field", FIELDS, ids=lambda field: type(field).__name__)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(value=values)
def test_a_preparer_gives_what_get_db_prep_save_gives(field, value):
    _agree(save_preparer(field, connection), lambda: field.get_db_prep_save(value, connection), value)


def _agree(prepare, the_fields_way, value):
    """`prepare(value, connection)` gives what `the_fields_way()` gives, of the same type, or
    refuses the value as it does."""
    try:
        expected = the_fields_way()
    except Exception as exc:  # the field refuses the value: so does the preparer, the same way
        with pytest.raises(type(exc)):
            prepare(value, connection)
        return
    prepared = prepare(value, connection)
    assert _comparable(prepared) == _comparable(expected)
    assert type(prepared) is type(expected)


def test_a_subclass_of_str_and_an_unknown_field_class_go_the_fields_way():
    class Upper(CharField):
        def get_prep_value(self, value):
            return super().get_prep_value(value).upper()

    assert save_preparer(Upper(max_length=5), connection)("abc", connection) == "ABC"
    value = _Str("abc")
    assert save_preparer(CharField(max_length=5), connection)(value, connection) is value


def test_the_check_catches_a_preparer_that_differs():
    field = CharField(max_length=5)
    with pytest.raises(AssertionError, match="get_db_prep_save gives"):
        prepared_checked(field, lambda value, connection: value.upper(), "abc", connection)
    assert prepared_checked(field, save_preparer(field, connection), "abc", connection) == "abc"


LOOKUP_FIELDS = [UUIDField(), CharField(max_length=20), TextField(), IntegerField(), PositiveIntegerField(),
                 BigIntegerField()]
lookup_values = st.one_of(
    st.uuids(), st.uuids().map(str), st.uuids().map(lambda value: value.hex), st.text(max_size=8), st.integers(),
    st.booleans(), st.none(), st.builds(_Str, st.text(max_size=4)), st.just(lazy(lambda: "lazy", str)()),
)


@pytest.mark.parametrize("field", LOOKUP_FIELDS, ids=lambda field: type(field).__name__)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(value=lookup_values)
def test_a_lookup_preparer_gives_what_the_exact_lookup_sends(field, value):
    _agree(lookup_preparer(field, connection),
           lambda: field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True), value)


def test_a_lookup_preparer_takes_a_uuid_as_it_is_only_where_the_backend_stores_uuids():
    value = uuid.uuid4()
    prepared = lookup_preparer(UUIDField(), connection)(value, connection)
    assert prepared == (value if connection.features.has_native_uuid_field else value.hex)
