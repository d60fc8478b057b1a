"""`jobs.timestamps.iso_utc` writes every time as DRF's DateTimeField does (the API's JSON)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.fields import DateTimeField

from jobs import timestamps
from jobs.timestamps import iso_utc

ZONES = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30)),
                         ZoneInfo("Europe/Paris"), ZoneInfo("UTC"), timezone(timedelta(0)), None])


def _isoformat_utc_as_z(value: datetime) -> str:
    """What DRF's DateTimeField writes once the value is in its zone: `isoformat`, `+00:00` as `Z`."""
    text = value.isoformat()
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 30), timezones=ZONES))
def test_a_time_is_written_as_isoformat_with_utc_as_z(value):
    assert iso_utc(value) == _isoformat_utc_as_z(value) == iso_utc(value)  # the second call reads the kept text


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)))
def test_a_utc_time_is_written_as_the_apis_fields_write_it(value):
    with override_settings(USE_TZ=True, TIME_ZONE="UTC"):
        assert iso_utc(value) == DateTimeField().to_representation(value)


def test_no_fraction_when_the_microseconds_are_zero_and_z_for_utc():
    assert iso_utc(datetime(2026, 12, 4, 10, 0, tzinfo=UTC)) == "2026-12-04T10:00:00Z"
    assert iso_utc(datetime(2026, 12, 4, 10, 0, 0, 50, tzinfo=UTC)) == "2026-12-04T10:00:00.000050Z"
    assert iso_utc(datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC)) == "0999-01-02T03:04:05Z"
    assert iso_utc(datetime(2026, 12, 4, 12, 0, tzinfo=timezone(timedelta(hours=2)))) == "2026-12-04T12:00:00+02:00"
    assert iso_utc(None) is None


def test_the_kept_texts_are_bounded(monkeypatch):
    monkeypatch.setattr(timestamps, "_WRITTEN_MAX", 4)
    timestamps._written.clear()
    start = datetime(2026, 12, 4, tzinfo=UTC)
    texts = [iso_utc(start + timedelta(seconds=n)) for n in range(10)]
    assert len(timestamps._written) <= 4 and texts[-1] == "2026-12-04T00:00:09Z"
