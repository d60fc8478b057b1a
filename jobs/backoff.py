"""Exponential back-off with jitter, for every retry the platform schedules (a job's automatic
retry, a webhook delivery's)."""

from __future__ import annotations

import random


def backoff_with_jitter(attempt: int, *, base: float, cap: float) -> float:
    """Seconds to wait before retry number `attempt` (1, 2, …): `base` doubling per attempt,
    capped at `cap`; half of it fixed, half random, so that many failures at once do not all
    come back at the same moment."""
    ceiling = min(cap, base * 2 ** max(attempt - 1, 0))
    return ceiling / 2 + random.uniform(0, ceiling / 2)
