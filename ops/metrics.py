"""Prometheus metrics of the whole platform, computed from the database and Redis when scraped.

Web servers and workers are separate processes (and scale out to many), so counters kept in a
process's memory would each see a slice and reset on every restart. Instead
`PlatformCollector` asks the source of truth at scrape time: a handful of aggregate queries
(GROUP BY, conditional counts; the histograms are bucketed in the database) and a few Redis
commands. A new registry is built for each request (`ops.views.metrics`), so nothing is kept
between scrapes and nothing is registered in prometheus-client's global registry.

Counters derived from rows (`*_total`) count rows of the event log: they only grow while events
are kept, and deleting jobs lowers them (Prometheus reads that as a counter reset). Histograms
over a window (METRICS_WINDOW seconds) describe the jobs, answers and wakes of that window; they
are exposed as gauge histograms (their counts go down as the window moves on): use
`histogram_quantile` on the bucket series directly, without `rate()`.

The README's Operations section lists every metric.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.fields.json import KT
from django.utils import timezone
from kombu.transport.redis import Channel as RedisChannel
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from approvals.models import Question
from jobs.broker import held_messages
from jobs.models import Job, JobEvent
from jobs.registry import kinds_all
from ops.scheduler import scheduler_seen
from ops.workers import WorkerSeen, redis_client, redis_now, workers_seen
from waits.models import Wait

logger = logging.getLogger(__name__)

PREFIX = "taskplatform"
# Upper bounds of the histogram buckets, in seconds (+Inf is added).
RUN_DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600)
ANSWER_LATENCY_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 86400, 3 * 86400)
WAKE_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Wake latencies are read (newest first) and bucketed here, at most this many per scrape.
WAKE_ROWS_LIMIT = 10_000
# A status event into `pending` says why in its message; the key that marks each kind of retry.
RETRY_REASONS = {
    "retry_in": "error",  # an automatic retry after an error (jobs.services.job_fail)
    "retry": "manual",  # a person retried a failed or cancelled job (job_retry)
    "lease_expired": "worker_lost",  # its worker died; the reconciler took it back
    "handed_back": "handed_back",  # its worker shut down and gave it back
}
FINISHED_RUN_STATUSES = (Job.Status.COMPLETED, Job.Status.FAILED)


def _name(name: str) -> str:
    return f"{PREFIX}_{name}"


def _duration(end: str, start: str) -> ExpressionWrapper:
    return ExpressionWrapper(F(end) - F(start), output_field=DurationField())


def _seconds(value: timedelta | None) -> float:
    return value.total_seconds() if value is not None else 0.0


# -- the database ---------------------------------------------------------------------------------
def jobs_by_kind_and_status() -> list[dict[str, Any]]:
    """`kind`, `status`, `count` of every job (index job_kind_status)."""
    return list(Job.objects.values("kind", "status").annotate(count=Count("pk")).order_by())


def failed_jobs_by_code() -> list[dict[str, Any]]:
    """`kind`, `code`, `count` of the jobs failed now, by their error's code."""
    return list(
        Job.objects.filter(status=Job.Status.FAILED)
        .values("kind", code=KT("error__code"))
        .annotate(count=Count("pk"))
        .order_by()
    )


def status_event_counts() -> dict[str, dict[str, int]]:
    """From the `status` events, in one pass: transitions by the status entered, failures by
    error code, and moves back to `pending` by reason (RETRY_REASONS)."""
    rows = (
        JobEvent.objects.filter(type=JobEvent.Type.STATUS)
        .values("status", code=KT("message__error__code"))
        .annotate(
            count=Count("id"),
            **{reason: Count("id", filter=Q(message__has_key=key)) for key, reason in RETRY_REASONS.items()},
        )
        .order_by()
    )
    transitions: dict[str, int] = defaultdict(int)
    failures: dict[str, int] = defaultdict(int)
    retries = dict.fromkeys(RETRY_REASONS.values(), 0)
    for row in rows:
        transitions[row["status"]] += row["count"]
        if row["status"] == Job.Status.FAILED:
            failures[row["code"] or "unknown"] += row["count"]
        if row["status"] == Job.Status.PENDING:
            for reason in retries:
                retries[reason] += row[reason]
    return {"transitions": dict(transitions), "failures": dict(failures), "retries": retries}


def _bucketed(rows: QuerySet, *, value: str, bounds: Sequence[float], group: Sequence[str]) -> list[dict[str, Any]]:
    """Per group: `count`, `sum` (timedelta) and cumulative counts `le_0`, `le_1`, … of the
    duration annotation `value` at `bounds`, counted by the database."""
    buckets = {
        f"le_{index}": Count("pk", filter=Q(**{f"{value}__lte": timedelta(seconds=bound)}))
        for index, bound in enumerate(bounds)
    }
    if not group:
        return [rows.aggregate(count=Count("pk"), sum=Sum(value), **buckets)]
    return list(rows.values(*group).annotate(count=Count("pk"), sum=Sum(value), **buckets).order_by())


def run_durations(*, since: datetime) -> list[dict[str, Any]]:
    """The last run of each job that completed or failed since `since` (finished_at -
    started_at; `started_at` is the claim of its last run), bucketed by kind and status."""
    finished = Job.objects.filter(
        status__in=FINISHED_RUN_STATUSES, finished_at__gte=since, started_at__isnull=False
    ).annotate(duration=_duration("finished_at", "started_at"))
    return _bucketed(finished, value="duration", bounds=RUN_DURATION_BUCKETS, group=["kind", "status"])


def open_questions(*, now: datetime) -> dict[str, Any]:
    """How many questions are open, how many are past their deadline, and when the oldest
    (last) opened (index question_status_created)."""
    return Question.objects.filter(status=Question.Status.OPEN).aggregate(
        count=Count("pk"), overdue=Count("pk", filter=Q(expires_at__lte=now)), oldest=Min("opened_at")
    )


def answer_latencies(*, since: datetime) -> list[dict[str, Any]]:
    """The questions answered since `since`: answered_at - opened_at, bucketed."""
    answered = Question.objects.filter(status=Question.Status.ANSWERED, answered_at__gte=since).annotate(
        waited=_duration("answered_at", "opened_at")
    )
    return _bucketed(answered, value="waited", bounds=ANSWER_LATENCY_BUCKETS, group=[])


def active_waits() -> list[dict[str, Any]]:
    """`service`, `state`, `count`, `oldest` (created_at) of the waits not finished (the
    partial index wait_active_due covers these rows)."""
    return list(
        Wait.objects.filter(state__in=Wait.ACTIVE)
        .values("service", "state")
        .annotate(count=Count("pk"), oldest=Min("created_at"))
        .order_by()
    )


def wake_latencies(*, since: datetime, limit: int = WAKE_ROWS_LIMIT) -> list[tuple[str, float]]:
    """`(by, seconds)` for each wake since `since`: from a `woken` wait event (by callback,
    schedule or admin) to the job's next `processing` status event; newest first, at most
    `limit`. Only jobs whose wait row changed in the window are looked at (a woken wait is
    touched again when its run begins), so the event log is read through its (job, seq) index."""
    running = (
        JobEvent.objects.filter(
            job_id=OuterRef("job_id"), seq__gt=OuterRef("seq"), type=JobEvent.Type.STATUS,
            status=Job.Status.PROCESSING,
        )
        .order_by("seq")
        .values("created_at")[:1]
    )
    rows = (
        JobEvent.objects.filter(
            job_id__in=Wait.objects.filter(updated_at__gte=since).values("job_id"),
            type=JobEvent.Type.WAIT, status="woken", created_at__gte=since,
        )
        .annotate(running_at=Subquery(running), by=KT("message__by"))
        .filter(running_at__isnull=False)
        .order_by("-created_at")
        .values_list("by", "created_at", "running_at")[:limit]
    )
    return [(by or "unknown", max((running_at - woken_at).total_seconds(), 0.0)) for by, woken_at, running_at in rows]


# -- Redis ------------------------------------------------------------------------------------------
def queue_names(workers: Iterable[WorkerSeen] = ()) -> list[str]:
    """The default queue, the platform queue, every queue a registered kind asks for, and every
    queue a worker said it consumes."""
    names = {settings.CELERY_TASK_DEFAULT_QUEUE, settings.JOBS_PLATFORM_QUEUE}
    names |= {kind.queue for kind in kinds_all() if kind.queue}
    for worker in workers:
        names |= set(worker.queues)
    return sorted(names)


def queue_depths(names: Sequence[str]) -> tuple[dict[str, int], int]:
    """Messages waiting in each Celery queue of the broker, and the job messages the live workers
    hold (running, reserved, or waiting for a countdown: `jobs.broker.held_messages`; the broker
    keeps no copy of a delivered message).

    Kombu's Redis transport keeps a queue as a list under the broker's `global_keyprefix`, one
    list per priority step (`jobs`, `jobs\\x06\\x163`, …); a queue's depth is their sum.
    """
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    prefix = options.get("global_keyprefix", "")
    steps = options.get("priority_steps", RedisChannel.priority_steps)
    sep = options.get("sep", RedisChannel.sep)
    with redis_client().pipeline(transaction=False) as pipe:
        for name in names:
            for step in steps:
                pipe.llen(f"{prefix}{name}{sep}{step}" if step else f"{prefix}{name}")
        lengths = pipe.execute()
    depths = {name: sum(lengths[index * len(steps):(index + 1) * len(steps)]) for index, name in enumerate(names)}
    return depths, held_messages()


# -- the collector -----------------------------------------------------------------------------------
def _gauge_histogram(name: str, documentation: str, labels: Sequence[str], rows: Iterable[dict[str, Any]],
                     bounds: Sequence[float]) -> GaugeHistogramMetricFamily:
    family = GaugeHistogramMetricFamily(_name(name), documentation, labels=list(labels))
    for row in rows:
        buckets = [(_bound(bound), row[f"le_{index}"]) for index, bound in enumerate(bounds)]
        family.add_metric([str(row[label]) for label in labels], [*buckets, ("+Inf", row["count"])],
                          gsum_value=_seconds(row["sum"]))
    return family


def _bound(bound: float) -> str:
    return str(float(bound))


def _bucket_in_python(values: Iterable[tuple[str, float]], bounds: Sequence[float], *,
                      label_name: str) -> list[dict[str, Any]]:
    """The rows `_gauge_histogram` takes, from `(label value, seconds)` pairs."""
    rows: dict[str, dict[str, Any]] = {}
    for label, seconds in values:
        row = rows.setdefault(label, {label_name: label, "count": 0, "sum": timedelta(0),
                                      **{f"le_{index}": 0 for index in range(len(bounds))}})
        row["count"] += 1
        row["sum"] += timedelta(seconds=seconds)
        for index, bound in enumerate(bounds):
            if seconds <= bound:
                row[f"le_{index}"] += 1
    return [rows[label] for label in sorted(rows)]


class PlatformCollector(Collector):
    """Every platform metric, read from the database and Redis at `collect()` time.

    A source that fails (the database, Redis) is logged and reported as
    `taskplatform_metrics_source_up{source=...} 0`; the others are still exposed.
    """

    def __init__(self, *, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        now = self.now or timezone.now()
        up = GaugeMetricFamily(_name("metrics_source_up"), "1 when the source answered this scrape, else 0.",
                               labels=["source"])
        for source, section in (("database", self._database), ("redis", self._redis)):
            try:
                families = list(section(now))
            except Exception:  # any failure of a source: report it, expose the rest
                logger.exception("metrics: the %s did not answer", source)
                up.add_metric([source], 0)
                continue
            up.add_metric([source], 1)
            yield from families
        yield up
        yield GaugeMetricFamily(_name("metrics_scrape_duration_seconds"),
                                "Seconds this scrape took to compute every metric.", value=time.monotonic() - started)

    # The database: jobs, the event log, questions, waits.
    def _database(self, now: datetime) -> Iterator[Metric]:
        since = now - timedelta(seconds=settings.METRICS_WINDOW)
        window = f"the last {settings.METRICS_WINDOW} s (METRICS_WINDOW)"

        jobs = GaugeMetricFamily(_name("jobs"), "Jobs by kind and current status.", labels=["kind", "status"])
        for row in jobs_by_kind_and_status():
            jobs.add_metric([row["kind"], row["status"]], row["count"])
        yield jobs

        failed = GaugeMetricFamily(_name("jobs_failed"), "Jobs in status failed now, by kind and error code.",
                                   labels=["kind", "code"])
        for row in failed_jobs_by_code():
            failed.add_metric([row["kind"], row["code"] or "unknown"], row["count"])
        yield failed

        events = status_event_counts()
        derived = "Counted from the rows of the job event log at scrape time (deleting jobs lowers it)."
        transitions = CounterMetricFamily(_name("job_transitions"),
                                          f"Status changes of jobs, by the status entered. {derived}",
                                          labels=["status"])
        for status in Job.Status.values:
            transitions.add_metric([status], events["transitions"].get(status, 0))
        yield transitions
        failures = CounterMetricFamily(_name("job_failures"), f"Jobs that failed, by error code. {derived}",
                                       labels=["code"])
        for code, count in sorted(events["failures"].items()):
            failures.add_metric([code], count)
        yield failures
        retries = CounterMetricFamily(
            _name("job_retries"),
            "Jobs sent back to pending to run again, by reason: error (automatic retry after an error), manual "
            f"(a person retried it), worker_lost (its worker died), handed_back (its worker shut down). {derived}",
            labels=["reason"],
        )
        for reason, count in events["retries"].items():
            retries.add_metric([reason], count)
        yield retries

        yield _gauge_histogram(
            "job_run_duration_seconds",
            f"Duration of the last run (claim to end) of the jobs that completed or failed in {window}.",
            ["kind", "status"], run_durations(since=since), RUN_DURATION_BUCKETS,
        )

        questions = open_questions(now=now)
        yield GaugeMetricFamily(_name("questions_open"), "Questions waiting for a person.", value=questions["count"])
        yield GaugeMetricFamily(_name("questions_overdue"), "Open questions past their deadline.",
                                value=questions["overdue"])
        oldest = questions["oldest"]
        yield GaugeMetricFamily(_name("question_oldest_open_age_seconds"),
                                "Seconds since the oldest open question opened (0 when none is open).",
                                value=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0)
        yield _gauge_histogram(
            "question_answer_latency_seconds",
            f"Seconds from a question opening to its answer, for the questions answered in {window}.",
            [], answer_latencies(since=since), ANSWER_LATENCY_BUCKETS,
        )

        waits = GaugeMetricFamily(_name("waits_active"),
                                  "Waits on external work not finished: state waiting is a parked job (no worker "
                                  "held), submitting one still handing the work out.", labels=["service", "state"])
        oldest_wait = None
        for row in active_waits():
            waits.add_metric([row["service"], row["state"]], row["count"])
            oldest_wait = min(filter(None, [oldest_wait, row["oldest"]]), default=None)
        yield waits
        yield GaugeMetricFamily(_name("wait_oldest_active_age_seconds"),
                                "Seconds since the oldest unfinished wait began (0 when none).",
                                value=max((now - oldest_wait).total_seconds(), 0.0) if oldest_wait else 0.0)
        yield _gauge_histogram(
            "wake_latency_seconds",
            f"Seconds from a parked job being woken (by callback, schedule or admin) to its run starting, "
            f"for the wakes in {window}.",
            ["by"], _bucket_in_python(wake_latencies(since=since), WAKE_LATENCY_BUCKETS, label_name="by"),
            WAKE_LATENCY_BUCKETS,
        )

        yield from _scheduler_metrics()

    # Redis: the broker's queues and the workers' heartbeats.
    def _redis(self, now: datetime) -> Iterator[Metric]:
        now_seconds = redis_now()  # the workers' heartbeats are Redis's times (ops.workers)
        workers = workers_seen(now=now_seconds)
        names = queue_names(workers)
        depths, unacked = queue_depths(names)
        depth = GaugeMetricFamily(_name("queue_depth"), "Messages waiting in each Celery queue of the broker.",
                                  labels=["queue"])
        consumers = GaugeMetricFamily(_name("queue_consumers"),
                                      "Workers with a fresh heartbeat that consume each queue (0: nobody runs "
                                      "its jobs).", labels=["queue"])
        fresh = [worker for worker in workers if worker.is_fresh(now_seconds)]
        for name in names:
            depth.add_metric([name], depths[name])
            consumers.add_metric([name], sum(name in worker.queues for worker in fresh))
        yield depth
        yield consumers
        yield GaugeMetricFamily(_name("broker_unacked_messages"),
                                "Job messages delivered to live workers and not yet acknowledged (running, "
                                "reserved, or waiting for a countdown).",
                                value=unacked)
        heartbeat = GaugeMetricFamily(_name("worker_heartbeat_timestamp_seconds"),
                                      "When each worker last wrote its heartbeat (Unix time).", labels=["worker"])
        last_job = GaugeMetricFamily(_name("worker_last_job_timestamp_seconds"),
                                      "When each worker last began running a job (Unix time; absent before its first).",
                                      labels=["worker"])
        for worker in workers:
            heartbeat.add_metric([worker.hostname], worker.seen_at)
            if worker.last_job_at is not None:
                last_job.add_metric([worker.hostname], worker.last_job_at)
        yield heartbeat
        yield last_job


def _scheduler_metrics() -> Iterator[Metric]:
    """The periodic passes' scheduler (ops.scheduler): its heartbeat and each pass's last run,
    ages by the database's clock; +Inf for what never happened."""
    seen = scheduler_seen()
    inf = float("inf")
    yield GaugeMetricFamily(_name("scheduler_heartbeat_age_seconds"),
                            "Seconds since the scheduler (celery beat) holding the lease last renewed it (+Inf: no "
                            "scheduler ever ran). Above 3 heartbeat intervals /readyz answers 503.",
                            value=inf if seen.heartbeat_ago is None else seen.heartbeat_ago)
    yield GaugeMetricFamily(_name("scheduler_lease_epoch"),
                            "How many times the scheduler's lease changed hands (1 after the first start; rising: "
                            "schedulers dying or taking over).", value=seen.epoch)
    age = GaugeMetricFamily(_name("periodic_pass_age_seconds"),
                            "Seconds since each periodic pass last finished without an error (+Inf: never).",
                            labels=["pass"])
    duration = GaugeMetricFamily(_name("periodic_pass_duration_seconds"), "How long each pass's last run took.",
                                 labels=["pass"])
    runs = CounterMetricFamily(_name("periodic_pass_runs"),
                               "Runs of each periodic pass, by outcome: succeeded, failed, or skipped (another run "
                               "of it held its lock).", labels=["pass", "outcome"])
    for seen_pass in seen.passes:
        age.add_metric([seen_pass.name], inf if seen_pass.succeeded_ago is None else seen_pass.succeeded_ago)
        if seen_pass.duration is not None:
            duration.add_metric([seen_pass.name], seen_pass.duration)
        runs.add_metric([seen_pass.name, "succeeded"], seen_pass.runs - seen_pass.failures)
        runs.add_metric([seen_pass.name, "failed"], seen_pass.failures)
        runs.add_metric([seen_pass.name, "skipped"], seen_pass.skipped)
    yield age
    yield duration
    yield runs
