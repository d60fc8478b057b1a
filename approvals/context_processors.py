"""Template context for the admin: how many questions wait for the signed-in user."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

from approvals.selectors import questions_waiting_count


def questions_waiting(request: HttpRequest) -> dict[str, Callable[[], int]]:
    """`questions_waiting`: a callable the template calls, counted once per request and only when
    a template shows it (the admin index), so other pages pay nothing."""
    user: Any = getattr(request, "user", None)
    counted: list[int] = []

    def count() -> int:
        if not counted:
            counted.append(questions_waiting_count(user))
        return counted[0]

    return {"questions_waiting": count}
