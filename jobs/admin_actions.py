"""What the admin's bulk actions share: call a service on each selected object on its own, then
tell the user what was done and what was refused (and why)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from jobs.errors import PlatformError


def admin_apply_each(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    objects: Iterable[Any],
    call: Callable[[Any], Any],
    *,
    verb: str,
    noun: str,
    describe: Callable[[Any], str] = str,
) -> None:
    """Run `call(obj)` for each object; one refusal (a PlatformError) never stops the others."""
    done, refused = 0, []
    for obj in objects:
        try:
            call(obj)
            done += 1
        except PlatformError as exc:
            refused.append(f"{describe(obj)}: {exc.message}")
    if done:
        model_admin.message_user(request, f"{verb} {done} {noun}(s).", messages.SUCCESS)
    if refused:
        model_admin.message_user(request, f"Refused {len(refused)}: " + "; ".join(refused), messages.WARNING)
