"""The app's task class (dbkit/tasks.py) and `jobs.run`'s (jobs/tasks.py): what Celery's task
signals did around each task, done by the task itself, so that a worker has no receiver of
`task_prerun` or `task_postrun` and Celery's tracer sends neither (bench/README.md, "Around each
task, no signal"). A worker's own runs: tests/jobs/test_task_connections.py, tests/ops/test_logging.py."""

from __future__ import annotations

import uuid
from unittest import mock

import pytest
from celery import Task, signals
from celery.exceptions import Retry

from dbkit import tasks as task_class
from jobs import extensions
from jobs.extensions import RunStart, run_observer
from jobs.models import Job
from jobs.services import job_submit
from jobs.tasks import job_run
from taskplatform import celery as worker_setup
from taskplatform.celery import app


def test_every_task_of_the_app_checks_its_own_connections():
    """A task made with a plain `celery.Task` as its base would bring the signals back for every
    task (`_check_connections_of_foreign_tasks`): none of the platform's is."""
    app.loader.import_default_modules()  # every app's tasks module, as a worker's start imports them
    assert app.tasks["jobs.run"] and app.tasks["jobs.reconcile"]
    assert task_class.tasks_without_connections(app.tasks) == []
    assert isinstance(app.tasks["webhooks.deliver"], task_class.DatabaseTask)  # no base of its own: the app's


def test_without_a_foreign_task_no_task_signal_has_a_receiver_in_a_worker():
    with mock.patch.object(signals.task_prerun, "receivers", []), \
            mock.patch.object(signals.task_postrun, "receivers", []):
        worker_setup._take_over_the_fixups_task_hooks()
        worker_setup._check_connections_of_foreign_tasks()
        assert signals.task_prerun.receivers == [] and signals.task_postrun.receivers == []


def test_a_foreign_task_gets_its_connections_checked_by_the_signals_and_only_it():
    def plain(x):
        return x

    foreign = app.task(name="tests.foreign_plain", base=Task, shared=False)(plain)
    try:
        assert task_class.tasks_without_connections(app.tasks) == ["tests.foreign_plain"]
        with mock.patch.object(signals.task_prerun, "receivers", []), \
                mock.patch.object(signals.task_postrun, "receivers", []), \
                mock.patch.object(worker_setup, "connections_before_task") as before, \
                mock.patch.object(worker_setup, "connections_after_task") as after:
            worker_setup._check_connections_of_foreign_tasks()
            assert len(signals.task_prerun.receivers) == len(signals.task_postrun.receivers) == 1
            for task, calls in ((foreign, 1), (job_run, 0)):
                before.reset_mock()
                after.reset_mock()
                task.push_request(id="t", is_eager=False, called_directly=False)
                try:
                    signals.task_prerun.send(sender=task, task=task, task_id="t", args=(), kwargs={})
                    signals.task_postrun.send(sender=task, task=task, task_id="t", args=(), kwargs={})
                finally:
                    task.pop_request()
                assert (before.call_count, after.call_count) == (calls, calls), task.name
    finally:
        app.tasks.pop("tests.foreign_plain", None)


def test_a_task_called_as_a_function_is_celerys_own_call():
    """No tracer pushed a request: Celery's `Task.__call__` pushes one with the call's arguments,
    and nothing is checked around it."""
    seen = {}

    def body(self, value):
        seen["args"], seen["directly"] = self.request.args, self.request.called_directly
        return value * 2

    task = app.task(name="tests.called_directly", bind=True, shared=False)(body)
    try:
        with mock.patch.object(task_class, "connections_after_task") as after:
            assert task(21) == 42
        assert seen == {"args": [21], "directly": True} or seen == {"args": (21,), "directly": True}
        after.assert_not_called()
    finally:
        app.tasks.pop("tests.called_directly", None)


@pytest.mark.django_db
def test_a_run_of_a_job_tells_its_observers_as_it_begins_and_after_celerys_own_lines():
    """By its caller (`apply()`): begun with the job's id and `eager`; ended once, after the run,
    as Celery calls `after_return`."""
    with mock.patch("jobs.services.transitions.job_dispatch"):
        job, _ = job_submit(kind="demo.noop", input={})
    happened = []

    def observe(run: RunStart):
        happened.append(("begin", run))
        return lambda: happened.append(("end", Job.objects.get(pk=run.job_id).status))

    with mock.patch.dict(extensions._run_observers):  # registered for this test only
        run_observer("tests.observer")(observe)
        job_run.apply(args=[str(job.pk)], shadow="demo.noop")
    begins = [what for what in happened if what[0] == "begin"]
    assert [run.job_id for _, run in begins] == [str(job.pk)]
    assert begins[0][1].eager is True
    assert happened[-1] == ("end", Job.Status.COMPLETED)
    assert [what[0] for what in happened].count("end") == 1


@pytest.mark.django_db
def test_a_run_celery_calls_no_after_return_for_ends_as_the_next_begins():
    """A retried message (Celery's `Retry`: no `after_return`) ends its observers' run when the
    next run of the task begins, not never."""
    ended = []
    with mock.patch.dict(extensions._run_observers):  # registered for this test only
        run_observer("tests.observer")(lambda run: (lambda: ended.append(run.job_id)))
        first, second = str(uuid.uuid4()), str(uuid.uuid4())
        with mock.patch("jobs.tasks.job_execute", side_effect=Retry("again")):
            job_run.apply(args=[first])
        assert ended == []
        job_run.apply(args=[second])  # no such job: skipped, and ended as usual
        assert ended == [first, second]
