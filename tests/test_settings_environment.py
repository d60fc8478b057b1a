"""The settings read the environment strictly (taskplatform/settings/environment.py): a value
django-environ would misread stops the process with one line naming the variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from taskplatform.settings.environment import FALSE_WORDS, TRUE_WORDS, SettingsEnv
from tests.support.processes import child_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(monkeypatch):
    def read(value: str | None, how: str, **kwargs):
        if value is None:
            monkeypatch.delenv("TP_PROBE", raising=False)
        else:
            monkeypatch.setenv("TP_PROBE", value)
        return getattr(SettingsEnv(), how)("TP_PROBE", **kwargs)
    return read


@pytest.mark.parametrize("word", sorted(TRUE_WORDS) + ["TRUE", " Yes "])
def test_true_words(env, word):
    assert env(word, "bool", default=False) is True


@pytest.mark.parametrize("word", sorted(FALSE_WORDS) + ["False", " OFF "])
def test_false_words(env, word):
    assert env(word, "bool", default=True) is False


@pytest.mark.parametrize("word", ["ture", "enabled", "yes please", "2x"])
def test_a_word_that_is_neither_stops_the_process_naming_it(env, word):
    # django-environ read each of these as False: a typo turned a safe default off.
    with pytest.raises(SystemExit) as stopped:
        env(word, "bool", default=True)
    assert str(stopped.value).startswith(f"taskplatform refuses to start: TP_PROBE={word!r} is not true or false")


def test_unset_takes_the_default(env):
    assert env(None, "bool", default=True) is True
    assert env(None, "int", default=7) == 7
    assert env(None, "float", default=0.5) == 0.5


@pytest.mark.parametrize(("text", "number"),
                         [("2", 2.0), ("0.5", 0.5), ("1e3", 1000.0), (" 30 ", 30.0), ("-1.5", -1.5)])
def test_numbers(env, text, number):
    assert env(text, "float", default=1.0) == number


@pytest.mark.parametrize("text", ["1.2.3", "60s", "1,5", "nan", "inf", ""])
def test_a_number_it_would_have_guessed_at_is_refused(env, text):
    # django-environ dropped what was not a digit: "1.2.3" was 12.3, "60s" 60, "1,5" 1.5.
    with pytest.raises(SystemExit) as stopped:
        env(text, "float", default=1.0)
    assert f"TP_PROBE={text!r} is not a number" in str(stopped.value)


@pytest.mark.parametrize("text", ["four", "1.5", ""])
def test_a_whole_number_that_is_not_stops_the_process(env, text):
    with pytest.raises(SystemExit) as stopped:
        env(text, "int", default=1)
    assert str(stopped.value) == f"taskplatform refuses to start: TP_PROBE={text!r} is not a whole number"


def test_a_count_below_its_minimum_stops_the_process(env):
    assert env("0", "count", default=5) == 0
    with pytest.raises(SystemExit) as stopped:
        env("-1", "count", default=5)
    assert str(stopped.value) == "taskplatform refuses to start: TP_PROBE=-1 is less than 0"


def test_an_entry_point_stops_with_one_line(tmp_path):
    """`manage.py` under the production settings, a security switch misspelt: it does not start
    with that switch off, and says why in one line (no traceback)."""
    env = child_env(DJANGO_SETTINGS_MODULE="taskplatform.settings.production",
                    DJANGO_SECRET_KEY="a-key-for-this-test-only-" + "x" * 40, DJANGO_SECURE_COOKIES="ture")
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "taskplatform refuses to start: DJANGO_SECURE_COOKIES='ture' is not true or false "
        "(1, ok, on, true, y, yes; 0, false, n, no, off)"
    ], result.stderr[-2000:]
