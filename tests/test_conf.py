"""`dbkit.conf.setting`: a setting read from `LazySettings`' own cache, which sees every change the
way Django's `settings` does (override_settings, pytest-django's fixture, a plain assignment)."""

from __future__ import annotations

from django.conf import settings
from django.test import override_settings

from dbkit.conf import setting


def test_a_setting_reads_as_django_reads_it_and_follows_every_change(settings):
    assert setting("JOBS_LEASE_SECONDS") == settings.JOBS_LEASE_SECONDS
    settings.JOBS_LEASE_SECONDS = 7  # pytest-django's fixture: override_settings underneath
    assert setting("JOBS_LEASE_SECONDS") == 7
    with override_settings(JOBS_LEASE_SECONDS=9):
        assert setting("JOBS_LEASE_SECONDS") == 9
    assert setting("JOBS_LEASE_SECONDS") == 7


def test_a_plain_assignment_and_a_setting_not_read_yet_are_seen():
    from django.conf import settings as django_settings

    before = django_settings.JOBS_CHECK_MOVE_STATEMENTS
    try:
        django_settings.JOBS_CHECK_MOVE_STATEMENTS = not before  # LazySettings drops its kept value
        assert setting("JOBS_CHECK_MOVE_STATEMENTS") is (not before)
    finally:
        django_settings.JOBS_CHECK_MOVE_STATEMENTS = before
    assert setting("JOBS_CHECK_MOVE_STATEMENTS") is before


def test_a_missing_setting_gives_its_default_or_the_error_django_gives():
    import pytest

    assert setting("NO_SUCH_SETTING_HERE", 42) == 42
    with pytest.raises(AttributeError):
        setting("NO_SUCH_SETTING_HERE")


def test_the_cache_read_is_the_one_lazysettings_keeps():
    # What `setting` relies on: LazySettings keeps a read setting in its instance's __dict__.
    settings.DEBUG  # noqa: B018 (read it, so that it is kept)
    assert object.__getattribute__(settings, "__dict__")["DEBUG"] is settings.DEBUG
