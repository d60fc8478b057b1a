"""Reads for the staff dashboard (`ops.dashboard`): jobs, questions and waits, now and over the
last hour.

Everything is grouped and counted in the database, a few aggregate queries per chart, and works
on PostgreSQL and SQLite alike; the one exception is percentiles, which SQLite cannot compute:
there (a development database) the durations are read and interpolated in Python the way
PostgreSQL's `percentile_cont` does. Every function takes `now`, so a test can pin the clock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.fields.json import KT
from django.db.models.functions import TruncMinute
from django.utils import timezone

from approvals.models import Question
from jobs.models import Job, JobEvent
from waits.models import Wait

WINDOW_MINUTES = 60
# Upper edges of the histogram of run durations; the last bucket is open-ended.
DURATION_EDGES = (1, 5, 30, 120, 600, 3600)
# Upper edges of the age buckets of open questions and active waits, in seconds.
AGE_EDGES = (300, 1800, 7200, 28800, 86400)
PERCENTILES = (0.5, 0.95)
# Job statuses that are a state of work in hand (the terminal ones only grow).
JOB_STATUSES_NOW = (Job.Status.PENDING, Job.Status.PROCESSING, Job.Status.PAUSED, Job.Status.WAITING)
# Question events that open a question, and those that close it (see the contract's event types).
QUESTION_OPENS = ("open",)
QUESTION_CLOSES = ("answered", "expired", "cancelled")
# Read at most this many durations per chart when the database cannot compute percentiles.
PYTHON_PERCENTILE_LIMIT = 50_000


class PercentileCont(Aggregate):
    """`percentile_cont(fraction) WITHIN GROUP (ORDER BY expression)`: PostgreSQL only."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)r) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def _window_start(now: datetime) -> datetime:
    """The first minute of the window: the last WINDOW_MINUTES minutes, the current one included."""
    return now.replace(second=0, microsecond=0) - timedelta(minutes=WINDOW_MINUTES - 1)


def window_minutes(now: datetime) -> list[datetime]:
    """The minutes the per-minute series count in, oldest first."""
    start = _window_start(now)
    return [start + timedelta(minutes=index) for index in range(WINDOW_MINUTES)]


def _per_minute(events: QuerySet[JobEvent], *, now: datetime) -> dict[str, list[int]]:
    """{event status: [count per minute of the window]} of `events`, counted in one GROUP BY."""
    minutes = window_minutes(now)
    position = {minute: index for index, minute in enumerate(minutes)}
    rows = (
        events.filter(created_at__gte=minutes[0], created_at__lte=now)
        .annotate(minute=TruncMinute("created_at"))
        .values("minute", "status")
        .annotate(count=Count("id"))
        .order_by()
    )
    series: dict[str, list[int]] = defaultdict(lambda: [0] * WINDOW_MINUTES)
    for row in rows:
        index = position.get(row["minute"])
        if index is not None:
            series[row["status"]][index] += row["count"]
    return series


def _duration(end: str, start: str) -> ExpressionWrapper:
    return ExpressionWrapper(F(end) - F(start), output_field=DurationField())


def _interpolate(ordered: Sequence[timedelta], fraction: float) -> timedelta | None:
    """The `fraction` percentile of sorted values, interpolated as `percentile_cont` does."""
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _percentiles(rows: QuerySet, *, value: str, group: str | None = None) -> dict[Any, list[timedelta | None]]:
    """{group value (None without `group`): [p50, p95]} of the duration annotation `value`."""
    fields = [group] if group else []
    if connections[rows.db].vendor == "postgresql":
        aggregates = {f"p{index}": PercentileCont(value, fraction, output_field=DurationField())
                      for index, fraction in enumerate(PERCENTILES)}
        if not group:
            result = rows.aggregate(**aggregates)
            return {None: [result[f"p{index}"] for index in range(len(PERCENTILES))]}
        grouped = rows.values(*fields).annotate(**aggregates).order_by()
        return {row[group]: [row[f"p{index}"] for index in range(len(PERCENTILES))] for row in grouped}
    values: dict[Any, list[timedelta]] = defaultdict(list)
    for row in rows.order_by(*fields, value).values_list(*fields, value)[:PYTHON_PERCENTILE_LIMIT]:
        values[row[0] if group else None].append(row[-1])
    return {key: [_interpolate(ordered, fraction) for fraction in PERCENTILES] for key, ordered in values.items()}


def _bucket_labels(edges: Iterable[int]) -> list[str]:
    """`["< 1 s", "1–5 s", …, "30 s–2 min", …, "≥ 1 h"]` for the bucket edges in seconds."""
    edges = list(edges)
    labels = [f"< {seconds_text(edges[0])}"]
    for low, high in zip(edges, edges[1:], strict=False):
        (low_number, low_unit), high_text = seconds_text(low).split(" ", 1), seconds_text(high)
        same_unit = high_text.endswith(f" {low_unit}")
        labels.append(f"{low_number if same_unit else seconds_text(low)}–{high_text}")
    return [*labels, f"≥ {seconds_text(edges[-1])}"]


def _duration_buckets(field: str, edges: Sequence[int]) -> list[Q]:
    """One filter per bucket [edge, next edge) of the duration annotation `field`."""
    bounds = [None, *edges, None]
    buckets = []
    for low, high in zip(bounds, bounds[1:], strict=False):
        condition = Q()
        if low is not None:
            condition &= Q(**{f"{field}__gte": timedelta(seconds=low)})
        if high is not None:
            condition &= Q(**{f"{field}__lt": timedelta(seconds=high)})
        buckets.append(condition)
    return buckets


def _age_buckets(field: str, edges: Sequence[int], *, now: datetime) -> list[Q]:
    """One filter per age bucket of the timestamp `field` (age: now - field), as plain
    comparisons of the timestamp so an index on it serves."""
    bounds = [None, *edges, None]
    buckets = []
    for low, high in zip(bounds, bounds[1:], strict=False):
        condition = Q()
        if low is not None:
            condition &= Q(**{f"{field}__lte": now - timedelta(seconds=low)})
        if high is not None:
            condition &= Q(**{f"{field}__gt": now - timedelta(seconds=high)})
        buckets.append(condition)
    return buckets


def seconds_text(seconds: float | None) -> str:
    """A duration as people read it: `850 ms`, `4.2 s`, `3 min`, `2 h 5 min`, `3 d 4 h`."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 60:
        return f"{round(seconds)} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def _age(since: datetime | None, now: datetime) -> float | None:
    return None if since is None else round(max((now - since).total_seconds(), 0.0), 3)


# -- jobs ---------------------------------------------------------------------------------------
def jobs_by_status_now() -> dict[str, int]:
    """How many jobs are pending, processing, paused and waiting now (one GROUP BY)."""
    counts = dict.fromkeys((status.value for status in JOB_STATUSES_NOW), 0)
    rows = Job.objects.filter(status__in=JOB_STATUSES_NOW).values("status").annotate(count=Count("pk")).order_by()
    for row in rows:
        counts[row["status"]] = row["count"]
    return counts


def jobs_per_minute(*, now: datetime) -> dict[str, Any]:
    """Status changes per minute over the last hour, by the status entered (from the `status`
    events: `completed` counts jobs that finished in that minute, `pending` submissions and
    resumptions, and so on)."""
    series = _per_minute(JobEvent.objects.filter(type=JobEvent.Type.STATUS), now=now)
    return {
        "minutes": [minute.isoformat() for minute in window_minutes(now)],
        "labels": [timezone.localtime(minute).strftime("%H:%M") for minute in window_minutes(now)],
        "series": {status.value: series[status.value] for status in Job.Status},
        "totals": {status.value: sum(series[status.value]) for status in Job.Status},
    }


def run_durations(*, now: datetime) -> dict[str, Any]:
    """How long the last run of each job that completed or failed in the last hour took
    (finished_at - started_at): a histogram by outcome, and count, p50, p95 and max per kind."""
    finished = Job.objects.filter(
        status__in=(Job.Status.COMPLETED, Job.Status.FAILED),
        finished_at__gt=now - timedelta(minutes=WINDOW_MINUTES),
        finished_at__lte=now,
        started_at__isnull=False,
    ).annotate(duration=_duration("finished_at", "started_at"))
    buckets = _duration_buckets("duration", DURATION_EDGES)
    outcomes = (Job.Status.COMPLETED, Job.Status.FAILED)
    counts = finished.aggregate(**{
        f"{outcome}_{index}": Count("pk", filter=Q(status=outcome) & bucket)
        for outcome in outcomes for index, bucket in enumerate(buckets)
    })
    per_kind = (
        finished.values("kind")
        .annotate(count=Count("pk"), failed=Count("pk", filter=Q(status=Job.Status.FAILED)), max=Max("duration"))
        .order_by("kind")
    )
    percentiles = _percentiles(finished, value="duration", group="kind")
    overall = _percentiles(finished, value="duration").get(None, [None, None])
    return {
        "buckets": _bucket_labels(DURATION_EDGES),
        "series": {outcome.value: [counts[f"{outcome}_{index}"] for index in range(len(buckets))]
                   for outcome in outcomes},
        "kinds": [
            {
                "kind": row["kind"],
                "count": row["count"],
                "failed": row["failed"],
                "p50": _seconds(percentiles.get(row["kind"], [None, None])[0]),
                "p95": _seconds(percentiles.get(row["kind"], [None, None])[1]),
                "max": _seconds(row["max"]),
            }
            for row in per_kind
        ],
        "p50": _seconds(overall[0]),
        "p95": _seconds(overall[1]),
    }


# -- questions ----------------------------------------------------------------------------------
def question_backlog(*, now: datetime) -> dict[str, Any]:
    """The open questions now (count, the oldest, age buckets), how the backlog moved over the
    last hour (rebuilt backwards from the count now and the `question` events that opened and
    closed questions in each minute), and how long the answered ones took."""
    open_questions = Question.objects.filter(status=Question.Status.OPEN)
    buckets = _age_buckets("opened_at", AGE_EDGES, now=now)
    summary = open_questions.aggregate(
        open=Count("pk"), oldest=Min("opened_at"), overdue=Count("pk", filter=Q(expires_at__lte=now)),
        **{f"age_{index}": Count("pk", filter=bucket) for index, bucket in enumerate(buckets)},
    )
    events = JobEvent.objects.filter(type=JobEvent.Type.QUESTION, status__in=QUESTION_OPENS + QUESTION_CLOSES)
    series = _per_minute(events, now=now)
    opened = [sum(series[status][index] for status in QUESTION_OPENS) for index in range(WINDOW_MINUTES)]
    closed = [sum(series[status][index] for status in QUESTION_CLOSES) for index in range(WINDOW_MINUTES)]
    # The backlog at the end of each minute: the count now, minus what opened later, plus what closed later.
    backlog, level = [0] * WINDOW_MINUTES, summary["open"]
    for index in reversed(range(WINDOW_MINUTES)):
        backlog[index] = max(level, 0)
        level -= opened[index] - closed[index]
    answered = Question.objects.filter(
        status=Question.Status.ANSWERED, answered_at__gt=now - timedelta(minutes=WINDOW_MINUTES),
        answered_at__lte=now,
    ).annotate(waited=_duration("answered_at", "opened_at"))
    answer_times = _percentiles(answered, value="waited").get(None, [None, None])
    return {
        "open": summary["open"],
        "overdue": summary["overdue"],
        "oldest_opened_at": summary["oldest"].isoformat() if summary["oldest"] else None,
        "oldest_age": _age(summary["oldest"], now),
        "ages": {"buckets": _bucket_labels(AGE_EDGES),
                 "counts": [summary[f"age_{index}"] for index in range(len(buckets))]},
        "backlog": backlog,
        "opened": opened,
        "closed": closed,
        "answered": answered.count(),
        "answer_p50": _seconds(answer_times[0]),
        "answer_p95": _seconds(answer_times[1]),
    }


# -- waits --------------------------------------------------------------------------------------
def waits_overview(*, now: datetime) -> dict[str, Any]:
    """Active waits on external work by service and state, how long they have waited (since the
    wait began), and the wake latency of the last hour: from a `woken` wait event (a callback, a
    scheduled look or a person) to the job's next `processing` status event."""
    active = Wait.objects.filter(state__in=Wait.ACTIVE)
    services: dict[str, dict[str, Any]] = {}
    rows = (
        active.values("service", "state")
        .annotate(count=Count("pk"), oldest=Min("created_at"), next_due=Min("next_due_at"))
        .order_by("service", "state")
    )
    for row in rows:
        entry = services.setdefault(row["service"] or "(unnamed)", {
            "service": row["service"] or "(unnamed)", "submitting": 0, "waiting": 0, "oldest": None, "next_due": None,
        })
        entry[row["state"]] += row["count"]
        entry["oldest"] = min(filter(None, [entry["oldest"], row["oldest"]]), default=None)
        entry["next_due"] = min(filter(None, [entry["next_due"], row["next_due"]]), default=None)
    buckets = _age_buckets("created_at", AGE_EDGES, now=now)
    summary = active.aggregate(
        active=Count("pk"), oldest=Min("created_at"),
        **{f"age_{index}": Count("pk", filter=bucket) for index, bucket in enumerate(buckets)},
    )
    running = JobEvent.objects.filter(
        job_id=OuterRef("job_id"), seq__gt=OuterRef("seq"), type=JobEvent.Type.STATUS, status=Job.Status.PROCESSING,
    ).order_by("seq").values("created_at")[:1]
    wakes = (
        JobEvent.objects.filter(
            type=JobEvent.Type.WAIT, status="woken",
            created_at__gt=now - timedelta(minutes=WINDOW_MINUTES), created_at__lte=now,
        )
        .annotate(running_at=Subquery(running), by=KT("message__by"))
        .filter(running_at__isnull=False)
        .annotate(latency=_duration("running_at", "created_at"))
    )
    by_source = _percentiles(wakes, value="latency", group="by")
    counts = {row["by"]: row["count"] for row in wakes.values("by").annotate(count=Count("id")).order_by()}
    overall = _percentiles(wakes, value="latency").get(None, [None, None])
    return {
        "active": summary["active"],
        "oldest_age": _age(summary["oldest"], now),
        "services": [
            {**entry, "oldest_age": _age(entry["oldest"], now),
             "oldest": entry["oldest"].isoformat() if entry["oldest"] else None,
             "next_due": entry["next_due"].isoformat() if entry["next_due"] else None}
            for entry in services.values()
        ],
        "ages": {"buckets": _bucket_labels(AGE_EDGES),
                 "counts": [summary[f"age_{index}"] for index in range(len(buckets))]},
        "wake_latency": {
            "count": sum(counts.values()),
            "p50": _seconds(overall[0]),
            "p95": _seconds(overall[1]),
            "by": [{"by": by or "unknown", "count": counts.get(by, 0), "p50": _seconds(values[0]),
                    "p95": _seconds(values[1])} for by, values in sorted(by_source.items(), key=lambda i: str(i[0]))],
        },
    }


def dashboard_snapshot(*, now: datetime | None = None) -> dict[str, Any]:
    """Everything the dashboard shows, as JSON-ready values (durations and ages in seconds)."""
    now = now or timezone.now()
    return {
        "generated_at": now.isoformat(),
        "window_minutes": WINDOW_MINUTES,
        "jobs_now": jobs_by_status_now(),
        "jobs_per_minute": jobs_per_minute(now=now),
        "durations": run_durations(now=now),
        "questions": question_backlog(now=now),
        "waits": waits_overview(now=now),
    }
