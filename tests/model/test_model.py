"""The stateful model (`tests/model/machine.py`), a small profile for `make test`; the long one
is `bench/model.py`."""

from __future__ import annotations

import logging
import os

import pytest
from django.db import connection
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import PlatformModel

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the model runs against PostgreSQL"),
]

EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "12"))
STEPS = int(os.environ.get("MODEL_STEPS", "40"))


@pytest.fixture
def quiet():
    """The runner logs every failed run with its traceback: thousands here."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def test_random_interleavings_keep_every_invariant(quiet):
    run_state_machine_as_test(
        PlatformModel,
        settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
            # No explain phase: on Python 3.11 it traces every line, ten times slower.
            phases=[Phase.generate, Phase.shrink] if os.environ.get("MODEL_SHRINK", "1") == "1" else [Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
