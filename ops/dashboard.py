"""The staff dashboard: `/ops/`, a page in the admin's look, and `/ops/data/`, its numbers as JSON.

The page renders its tiles and tables on the server (it is useful without JavaScript) and embeds
the same snapshot for its charts (Chart.js, vendored under `ops/static/ops/vendor/`); its script
then fetches `/ops/data/` every REFRESH_SECONDS and redraws. Both answer staff only: anonymous
callers are sent to the admin's login, signed-in non-staff get 403. The numbers come from
`ops.selectors`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import Any

from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ops.scheduler import SchedulerSeen, scheduler_seen
from ops.selectors import dashboard_snapshot, seconds_text

REFRESH_SECONDS = 10
# One colour per job status, the same in every chart; the browser test looks for them in the
# pixels. Opaque and distinct, readable on the admin's light and dark themes.
STATUS_COLORS = {
    "pending": "#8a9bab",
    "processing": "#3d85c6",
    "paused": "#e69f00",
    "waiting": "#8e6bbf",
    "completed": "#2e9d57",
    "failed": "#d64541",
    "cancelled": "#5f5f5f",
}
# Questions wait for a person (as a paused job does); waits for a service (as a waiting job does).
CHART_COLORS = {
    **STATUS_COLORS,
    "questions": STATUS_COLORS["paused"],
    "questions_opened": "#f2c76b",
    "questions_closed": "#9c6d12",
    "submitting": "#c2aee0",
}


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Like the admin: anonymous callers go to its login page and come back; signed-in users who
    are not active staff get 403."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied("the operations dashboard is for staff")
        return view(request, *args, **kwargs)

    return guarded


def tiles(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The plain numbers at the top of the page: `key`, `label`, `value` (raw), `text` (shown)
    and `alert` (worth a look)."""
    jobs_now, per_minute = snapshot["jobs_now"], snapshot["jobs_per_minute"]["totals"]
    questions, waits, durations = snapshot["questions"], snapshot["waits"], snapshot["durations"]
    window = f"last {snapshot['window_minutes']} min"

    def count(key: str, label: str, value: int, alert: bool = False) -> dict[str, Any]:
        return {"key": key, "label": label, "value": value, "text": f"{value:,}", "alert": alert}

    def age(key: str, label: str, seconds: float | None, alert: bool = False) -> dict[str, Any]:
        return {"key": key, "label": label, "value": seconds, "text": seconds_text(seconds), "alert": alert}

    scheduler = snapshot.get("scheduler")
    scheduler_tiles = [] if scheduler is None else [
        {**age("scheduler", "Scheduler heartbeat (beat)", scheduler["heartbeat_age"], alert=not scheduler["healthy"]),
         "text": "never" if scheduler["heartbeat_age"] is None else f"{seconds_text(scheduler['heartbeat_age'])} ago"},
    ]
    return [
        *scheduler_tiles,
        count("pending", "Pending jobs", jobs_now["pending"]),
        count("processing", "Processing", jobs_now["processing"]),
        count("completed", f"Completed, {window}", per_minute["completed"]),
        count("failed", f"Failed, {window}", per_minute["failed"], alert=per_minute["failed"] > 0),
        age("run_p95", f"Run time p95, {window}", durations["p95"]),
        count("paused", "Paused on a question", jobs_now["paused"]),
        count("questions_open", "Open questions", questions["open"], alert=questions["overdue"] > 0),
        age("questions_oldest", "Oldest open question", questions["oldest_age"]),
        count("waiting", "Waiting on a service", jobs_now["waiting"]),
        age("waits_oldest", "Longest active wait", waits["oldest_age"]),
        age("wake_p50", f"Wake to running p50, {window}", waits["wake_latency"]["p50"]),
    ]


def _add_texts(snapshot: dict[str, Any]) -> None:
    """Add `<name>_text` beside each duration and age the tables show, so the page's script shows
    what the server rendered without formatting durations a second way."""
    waits = snapshot["waits"]
    rows = [*snapshot["durations"]["kinds"], *waits["wake_latency"]["by"], waits["wake_latency"], waits,
            snapshot["questions"]]
    for row in rows:
        for name in ("p50", "p95", "max", "oldest_age", "answer_p50", "answer_p95"):
            if name in row:
                row[f"{name}_text"] = seconds_text(row[name])
    for row in snapshot["waits"]["services"]:
        row["oldest_age_text"] = seconds_text(row["oldest_age"])
        row["next_due_text"] = _due_text(row["next_due"], now=snapshot["generated_at"])
    generated_at = datetime.fromisoformat(snapshot["generated_at"])
    snapshot["generated_text"] = timezone.localtime(generated_at).strftime("%H:%M:%S")


def _due_text(due: str | None, *, now: str) -> str:
    if due is None:
        return "–"
    seconds = (datetime.fromisoformat(due) - datetime.fromisoformat(now)).total_seconds()
    return f"in {seconds_text(seconds)}" if seconds > 0 else "due now"


def scheduler_snapshot(seen: SchedulerSeen) -> dict[str, Any]:
    """The periodic passes' scheduler for the dashboard: its heartbeat's age (seconds by the
    database's clock, None: never), who leads, and each pass's last run."""
    return {
        "healthy": seen.healthy,
        "beating": seen.beating,
        "heartbeat_age": seen.heartbeat_ago,
        "silent_after": seen.silent_after,
        "leader": seen.holder if seen.beating else None,
        "epoch": seen.epoch,
        "passes": [
            {"name": p.name, "interval": p.interval, "late": p.late, "succeeded_ago": p.succeeded_ago,
             "duration": p.duration, "runs": p.runs, "failures": p.failures, "skipped": p.skipped,
             "last_error": p.last_error}
            for p in seen.passes
        ],
    }


def dashboard_payload() -> dict[str, Any]:
    """What `/ops/data/` answers and the page embeds: the snapshot, its tiles, the colours."""
    snapshot = dashboard_snapshot(now=timezone.now())
    snapshot["scheduler"] = scheduler_snapshot(scheduler_seen())
    _add_texts(snapshot)
    return {**snapshot, "tiles": tiles(snapshot), "colors": CHART_COLORS, "refresh_seconds": REFRESH_SECONDS}


@require_GET
@never_cache
@staff_required
def dashboard_page(request: HttpRequest) -> HttpResponse:
    payload = dashboard_payload()
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        "data": payload,
        "tiles": payload["tiles"],
        "durations": payload["durations"],
        "questions": payload["questions"],
        "waits": payload["waits"],
    }
    return render(request, "ops/dashboard.html", context)


@require_GET
@never_cache
@staff_required
def dashboard_data(request: HttpRequest) -> JsonResponse:
    return JsonResponse(dashboard_payload())


# Mounted under /ops/ by `ops.urls`.
urlpatterns = [
    path("", dashboard_page, name="ops-dashboard"),
    path("data/", dashboard_data, name="ops-dashboard-data"),
]
