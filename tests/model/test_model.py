"""The stateful model (`tests/model/machine.py`) against PostgreSQL: a small profile in `make
test`; the long one is `bench/model.py` (the same test with MODEL_EXAMPLES and MODEL_STEPS)."""

from __future__ import annotations

import json
import logging
import os

import pytest
from django.db import connection
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import STATS, PlatformModel

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the model runs against PostgreSQL"),
]

EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "12"))
STEPS = int(os.environ.get("MODEL_STEPS", "40"))
# No explain phase: on Python 3.11 it traces every line, ten times slower. MODEL_SHRINK=0 reports
# the first failing interleaving as found (a long profile can spend a long time shrinking one).
PHASES = [Phase.generate, Phase.shrink] if os.environ.get("MODEL_SHRINK", "1") == "1" else [Phase.generate]


@pytest.fixture
def quiet():
    """The runner logs every failed run with its traceback: thousands here."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture
def settings_no_back_off(settings):
    """Retries and hand-backs without a back-off: which moves are possible must not depend on the
    clock, or Hypothesis cannot replay an interleaving (the model puts back-offs in itself)."""
    settings.JOBS_RETRY_BACKOFF_BASE = 0.0
    settings.JOBS_RETRY_BACKOFF_MAX = 0.0


def test_random_interleavings_keep_every_invariant(quiet, settings_no_back_off):
    before = dict(STATS)
    try:
        run_state_machine_as_test(
            PlatformModel,
            settings=hypothesis_settings(
                max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None, phases=PHASES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        report = os.environ.get("MODEL_REPORT")
        if report:  # bench/model.py: what this run did
            done = {key: STATS[key] - before[key] for key in STATS}
            done["steps"] -= done["examples"]  # the check before the first step of each example
            with open(report, "w") as out:
                json.dump(done, out)
