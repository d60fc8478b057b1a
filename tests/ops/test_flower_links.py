"""The admin's links into Flower: they are on a job's page, and Flower finds the job's tasks with
them (its own search code, then a running Flower fed by a real worker)."""

from __future__ import annotations

import re
import socket
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from flower.utils.search import And, TaskSearchEngine, Term, parse_query

from jobs.models import Job
from jobs.services import job_submit
from ops.flower import flower_tasks_url
from tests.conftest import make_user
from tests.support.processes import ManagedProcess, celery_worker, child_env, wait_until

FLOWER = "http://flower.example:5555"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_initial_search(url: str) -> str:
    """The search Flower 2.2's tasks page starts with when opened at `url`
    (flower/static/js/flower.js): its `state`, `worker` and `name` parameters, each decoded with
    decodeURIComponent and written `key:value`, joined by spaces."""
    assert "+" not in urlsplit(url).query  # decodeURIComponent would keep a '+'; parse_qs would not
    query = parse_qs(urlsplit(url).query)
    return " ".join(f"{key}:{query[key][0]}" for key in ("state", "worker", "name") if key in query)


@pytest.mark.django_db
def test_the_job_page_in_the_admin_links_to_its_tasks_and_its_kinds_in_flower(client, settings):
    settings.FLOWER_URL = FLOWER
    settings.WORKER_TASK_EVENTS = True
    client.force_login(make_user("boss", superuser=True))
    job, _ = job_submit(kind="demo.noop", input={})
    page = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    links = re.findall(r'href="(http://flower\.example:5555/[^"]*)"', page)
    assert f"{FLOWER}/tasks?name=demo.noop%20args%3A{job.pk}" in links
    assert f"{FLOWER}/tasks?name=demo.noop" in links
    if any(field.name == "task_id" for field in Job._meta.fields):  # the run's Celery task id, when recorded
        Job.objects.filter(pk=job.pk).update(task_id="3f1e0c2a-task")
        page = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
        assert f'href="{FLOWER}/task/3f1e0c2a-task"' in page


@pytest.mark.django_db
def test_without_task_events_the_job_page_links_to_flowers_workers(client, settings):
    settings.FLOWER_URL = FLOWER
    settings.WORKER_TASK_EVENTS = False
    client.force_login(make_user("boss", superuser=True))
    job, _ = job_submit(kind="demo.noop", input={})
    page = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert f'href="{FLOWER}/workers"' in page and "WORKER_TASK_EVENTS=true" in page
    assert f"{FLOWER}/tasks" not in page


def test_flowers_search_reads_the_link_as_this_kind_and_this_job():
    job_id, other_id = uuid.uuid4(), uuid.uuid4()
    search = flower_initial_search(flower_tasks_url(kind="demo.sleep", job_id=job_id))
    assert parse_query(search) == And((Term("name", "demo.sleep"), Term("args", str(job_id))))

    def task(task_id: str, name: str, job: uuid.UUID) -> SimpleNamespace:
        # As Flower keeps a task from its events: the shadow name, the arguments as a repr.
        return SimpleNamespace(uuid=task_id, name=name, state="SUCCESS", worker=None, args=repr([str(job)]),
                               kwargs="{}", result="'completed'", timestamp=time.time())

    tasks = {t.uuid: t for t in [task("run-1", "demo.sleep", job_id), task("run-2", "demo.sleep", job_id),
                                 task("other", "demo.sleep", other_id), task("noop", "demo.noop", job_id)]}
    engine = TaskSearchEngine()
    engine.rebuild(tasks.items())
    assert sorted(engine.search(tasks, search).task_ids) == ["run-1", "run-2"]
    by_kind = flower_initial_search(flower_tasks_url(kind="demo.sleep"))
    assert sorted(engine.search(tasks, by_kind).task_ids) == ["other", "run-1", "run-2"]


@pytest.fixture
def flower():
    """A real Flower on this test run's broker (no login), as make run starts it: it leaves the
    workers' task events as their settings say (FLOWER_ENABLE_EVENTS=false)."""
    port = free_port()
    env = child_env(FLOWER_ENABLE_EVENTS="false")
    env.pop("FLOWER_BASIC_AUTH", None)
    celery = str(Path(sys.executable).parent / "celery")
    process = ManagedProcess("flower", [celery, "-A", "taskplatform", "flower", f"--port={port}",
                                        "--address=127.0.0.1"], env).start()
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/healthcheck", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, timeout=60, message=f"Flower never answered:\n{process.output[-3000:]}")
        yield url
    finally:
        process.stop()


def flower_tasks(flower: str, search: str) -> list[dict]:
    """The rows Flower's tasks page shows for `search` (the request its table makes)."""
    params = {"draw": 1, "start": 0, "length": 50, "order[0][column]": 0, "order[0][dir]": "desc",
              "columns[0][data]": "received", "search[value]": search}
    response = httpx.get(f"{flower}/tasks/datatable", params=params, timeout=5)
    response.raise_for_status()
    return response.json()["data"]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_running_flower_finds_the_jobs_task_through_the_link(only_own_workers, flower, settings):
    settings.FLOWER_URL = flower
    worker = celery_worker(name="events", env={"WORKER_TASK_EVENTS": "true"}).start()
    try:
        _find_the_jobs_task(flower)
    finally:
        worker.stop()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_without_task_events_flower_shows_the_worker_and_no_task(only_own_workers, flower, settings):
    """The shipped default: workers send no per-task events and Flower does not switch them on;
    Flower still lists the worker (its heartbeats), and the admin links to the workers."""
    worker = celery_worker(name="quiet").start()
    try:
        job, _ = job_submit(kind="demo.noop", input={})
        wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.COMPLETED, timeout=30)
        wait_until(lambda: "quiet-" in httpx.get(f"{flower}/workers", timeout=5).text, timeout=20,
                   message="Flower never listed the worker")
        time.sleep(2)  # a task event, had one been sent, would be in by now
        assert flower_tasks(flower, "") == []
    finally:
        worker.stop()


def _find_the_jobs_task(flower: str) -> None:
    for _ in range(3):  # Flower follows events live: a job run before it listened is not there
        job, _ = job_submit(kind="demo.noop", input={})
        wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.COMPLETED, timeout=30)  # noqa: B023
        link = flower_tasks_url(kind=job.kind, job_id=job.pk)
        try:
            # Flower learns the task's states from events, one after another: wait for its success.
            rows = wait_until(lambda: [row for row in flower_tasks(flower, flower_initial_search(link))  # noqa: B023
                                       if row["state"] == "SUCCESS"], timeout=10)
        except AssertionError:
            continue
        break
    else:
        pytest.fail("Flower never showed a job's task")
    [row] = rows
    assert row["name"] == "demo.noop" and str(job.pk) in row["args"] and row["state"] == "SUCCESS"
    # The link itself opens Flower's tasks page.
    assert httpx.get(link, timeout=5).status_code == 200
    everything = flower_tasks(flower, flower_initial_search(flower_tasks_url(kind="demo.noop")))
    assert row["uuid"] in {other["uuid"] for other in everything}
