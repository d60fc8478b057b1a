"""The worker's side of operations: Celery signal receivers, connected by `OpsConfig.ready`.

They run in every process that starts Celery (worker, beat) and do nothing elsewhere:

- Logging: Celery would replace Django's LOGGING with its own format; the platform's
  configuration applies instead (JSON in production, job id and kind on a job's lines).
- Around each run of `jobs.run` (a run observer, `job_run_observe`, registered by `OpsConfig.ready`),
  the job's id and kind are the log context of the pool process, and the time the worker last
  took a job is recorded for /readyz.
- The worker's heartbeat (its queues, that it is alive) for /readyz and /metrics.
- The worker's timer kept to the entries still to come (`timer_compact`).
- A line when a pool process is replaced, and why (Celery's pool says nothing of it).
"""

from __future__ import annotations

import heapq
import logging
import logging.config
import resource
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from billiard.pool import EX_RECYCLE
from celery import signals
from django.conf import settings

from jobs.extensions import RunStart
from ops.logging import job_log_context_reset, job_log_context_set
from ops.workers import worker_forget, worker_heartbeat, worker_job_taken

logger = logging.getLogger(__name__)


@signals.setup_logging.connect
def _logging_from_settings(loglevel: Any = None, logfile: str | None = None, **kwargs: Any) -> None:
    """Celery's worker and beat log through settings.LOGGING, as the web server does. Connecting
    here is what stops Celery from installing its own handlers; its `--loglevel` still applies,
    and `--logfile` gets a file handler with the same format."""
    logging.config.dictConfig(settings.LOGGING)
    root = logging.getLogger()
    if loglevel:
        root.setLevel(loglevel)
    if logfile:
        console = root.handlers[0]
        handler = logging.FileHandler(logfile)
        handler.setFormatter(console.formatter)
        for log_filter in console.filters:
            handler.addFilter(log_filter)
        root.addHandler(handler)


def job_run_observe(run: RunStart) -> Callable[[], None]:
    """A run of a job begins (`jobs.extensions.run_observer`): the job's id and kind name every
    line logged until it ends, and a worker's run is recorded for /readyz as the worker's last job."""
    token = job_log_context_set(job_id=run.job_id, job_kind=run.kind or _job_kind(run.job_id))
    if run.hostname and not run.eager:
        worker_job_taken(hostname=run.hostname)
    return partial(job_log_context_reset, token)


def _job_kind(job_id: str) -> str | None:
    """The kind of a job whose message did not name it (one sent by hand; `job_dispatch` names
    it as the message's shadow name): one primary-key lookup."""
    from jobs.models import Job

    try:
        return Job.objects.filter(pk=job_id).values_list("kind", flat=True).first()
    except Exception:  # a malformed id: the runner reports it; logging must not fail the task
        return None


@signals.worker_process_shutdown.connect
def _pool_process_replaced(sender: Any = None, pid: int | None = None, exitcode: int | None = None,
                           **kwargs: Any) -> None:
    """In a pool process that is about to exit: say why, when it is being replaced. Over its
    memory limit is a warning (job code that holds on to memory, or a kind that needs more than the
    limit, which then costs a new process after each of its jobs); after its tasks, a line. The
    pool gives such a process `EX_RECYCLE` as its exit code, either way."""
    if exitcode != EX_RECYCLE:
        return
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, as Celery reads it
    limit_kib = settings.CELERY_WORKER_MAX_MEMORY_PER_CHILD
    if limit_kib and peak_kib > limit_kib:
        logger.warning(
            "pool process %s replaced: it held %d MB at its peak, over WORKER_MAX_MEMORY_PER_CHILD_MB (%d); "
            "a job kind that needs more than that needs a higher limit", pid, peak_kib // 1024, limit_kib // 1024)
    else:
        logger.info("pool process %s replaced after %s jobs (WORKER_MAX_TASKS_PER_CHILD)", pid, _max_tasks())


def _max_tasks() -> Any:
    """This pool process's own task limit, as its pool gave it (billiard's `Worker`, the process's
    target): a worker's `--max-tasks-per-child` is not in the settings."""
    from billiard.process import current_process

    worker = getattr(current_process(), "_target", None)
    return getattr(worker, "maxtasks", None) or settings.CELERY_WORKER_MAX_TASKS_PER_CHILD


@signals.worker_ready.connect
def _heartbeat_begins(sender: Any = None, **kwargs: Any) -> None:
    """In the worker's main process, once it consumes: write the heartbeat now and then on the
    worker's own timer. A consumer that hangs stops beating, and /readyz notices."""
    consumer = sender
    hostname = consumer.hostname
    started_at = time.time()
    queues: list[str] = []

    def beat() -> None:
        # Read each time: `celery control add_consumer` changes them; keep the last known while
        # the consumer reconnects.
        if consumer.task_consumer is not None:
            queues[:] = [queue.name for queue in consumer.task_consumer.queues]
        worker_heartbeat(hostname=hostname, queues=queues, started_at=started_at)

    beat()
    consumer.timer.call_repeatedly(settings.OPS_HEARTBEAT_INTERVAL, beat)


@signals.worker_ready.connect
def _timer_compaction_begins(sender: Any = None, **kwargs: Any) -> None:
    """In the worker's main process: drop the timer's cancelled entries every
    WORKER_TIMER_COMPACT_INTERVAL seconds (`timer_compact`); 0 or less turns it off."""
    timer = getattr(sender, "timer", None)
    interval = settings.WORKER_TIMER_COMPACT_INTERVAL
    if interval <= 0 or not isinstance(getattr(timer, "_queue", None), list):  # not kombu's: no limits there
        return
    timer.call_repeatedly(interval, timer_compact, (timer,))


def timer_compact(timer: Any) -> int:
    """Rebuild the heap of kombu's `timer` without its cancelled entries; return how many it dropped.

    Celery puts each task's time limit (JOBS_TIME_LIMIT, an hour unless its kind says less) on
    the worker's timer, a heap in the main process, and cancels it when the task ends. A
    cancelled entry stays in the heap until its time comes, when the timer only skips it
    (celery/celery#5200). A worker running 100 jobs a second would hold 360,000 of them after an
    hour: about 150 MB, and each full garbage collection of the main process walks them all
    (170–290 ms more on a 2-core machine, during which it fetches, hands out and acknowledges
    nothing; bench/worker_timer.py).
    The heap is changed in place: the timer's loop reads it afresh at each step."""
    queue = timer._queue
    kept = [item for item in queue if not item.entry.canceled]
    dropped = len(queue) - len(kept)
    if dropped:
        heapq.heapify(kept)
        queue[:] = kept
        logger.debug("worker timer: %d cancelled entries dropped, %d kept", dropped, len(kept))
    return dropped


@signals.worker_shutdown.connect
def _heartbeat_ends(sender: Any = None, **kwargs: Any) -> None:
    hostname = getattr(sender, "hostname", None)
    if hostname:
        worker_forget(hostname=hostname)
