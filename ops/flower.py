"""Links into Flower (FLOWER_URL) for a job and for a kind.

A job's Celery tasks show in Flower under the job's kind (the `shadow` name `job_dispatch`
gives them) with the job id as their one argument; a job has one task per run (each retry,
each resume after an answer or a wake is a new message), so the link to "the job's task" is
Flower's task list searched for the kind and the id.

Flower 2.2's tasks page fills its search box from its `state`, `worker` and `name` URL
parameters, each as a `field:value` term, joined by spaces (`flower/static/js/flower.js`); it
has no parameter for the arguments. So the kind goes in `name` and the id rides along as a
second term, `name=demo.sleep args:<id>`, which the search reads as
`name:demo.sleep AND args:<id>` (tests/ops/test_flower_links.py checks this against Flower's
own search and a running Flower). The run in progress also has a direct link when the job
records its Celery task id.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.utils.html import format_html


def flower_tasks_url(*, kind: str, job_id: Any = None) -> str:
    """Flower's task list searched for the tasks of `kind` (and of the job `job_id`)."""
    search = f"{kind} args:{job_id}" if job_id is not None else kind
    return f"{settings.FLOWER_URL}/tasks?{urlencode({'name': search}, quote_via=quote)}"


def flower_task_url(task_id: str) -> str:
    """Flower's page of one Celery task."""
    return f"{settings.FLOWER_URL}/task/{quote(task_id)}"


def job_flower_links(job: Any) -> str:
    """The job's Celery tasks (one per run) and all tasks of its kind, in Flower: on the job's admin
    page (registered with `jobs.extensions.job_admin_link`). Flower knows tasks only from the
    workers' task events: without them (WORKER_TASK_EVENTS off, the default) the link is to the
    workers, and says how to see the tasks."""
    if not settings.WORKER_TASK_EVENTS:
        return format_html(
            'in Flower: <a href="{}">the workers</a> (its task list needs WORKER_TASK_EVENTS=true)',
            f"{settings.FLOWER_URL}/workers",
        )
    task_id = getattr(job, "task_id", "")  # the Celery task of its latest run, when recorded
    latest = format_html(' · <a href="{}">its latest run</a>', flower_task_url(task_id)) if task_id else ""
    return format_html(
        'in Flower: <a href="{}">this job\'s tasks</a>{} · <a href="{}">all {} tasks</a>',
        flower_tasks_url(kind=job.kind, job_id=job.pk), latest, flower_tasks_url(kind=job.kind), job.kind,
    )
