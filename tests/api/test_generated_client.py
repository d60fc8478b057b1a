"""A Python client generated from `/api/schema/` with openapi-python-client works, as a new user
would try it: generate it into a temporary folder, then submit a `demo.review` job, find its
question as a reviewer, answer it and see the job complete, through the generated code alone,
against a real server and a real worker. A schema change that breaks generated clients (or that
makes the generator leave pieces out) fails here.
"""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import call_command

from tests.api.conftest import api_server_running
from tests.conftest import reviewers_group
from tests.support.processes import VENV_BIN, wait_until

pytestmark = pytest.mark.worker
PACKAGE = "taskplatform_client"
GENERATOR_CONFIG = """\
project_name_override: taskplatform-client
package_name_override: taskplatform_client
post_hooks: []
"""


def generate_client(schema_url: str, folder: Path) -> None:
    """Write the client generated from the schema at `schema_url` to `folder`/taskplatform_client;
    fail on any warning of the generator (it then leaves endpoints or models out)."""
    (folder / "schema.json").write_bytes(httpx.get(schema_url, timeout=30).raise_for_status().content)
    (folder / "config.yaml").write_text(GENERATOR_CONFIG)
    run = subprocess.run(
        [str(VENV_BIN / "openapi-python-client"), "generate", "--path", str(folder / "schema.json"),
         "--output-path", str(folder / PACKAGE), "--meta", "none", "--config", str(folder / "config.yaml")],
        cwd=folder, capture_output=True, text=True,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "Warning" not in output and "Error" not in output, output


def api_token(username: str, *options: str) -> str:
    """A token as the README says to make one: `manage.py create_api_token` (last line)."""
    out = io.StringIO()
    call_command("create_api_token", username, *options, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


@pytest.fixture
def generated(tmp_path) -> Any:
    """Imports of the generated package, removed from `sys.modules` afterwards."""
    sys.path.insert(0, str(tmp_path))
    try:
        yield lambda name: importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def test_a_generated_client_submits_answers_and_sees_the_job_complete(worker, generated, tmp_path):
    reviewers_group()  # as its migration made it (a transactional test's flush drops it)
    with api_server_running() as url:
        generate_client(f"{url}/api/schema/?format=json", tmp_path)
        client = generated("client")
        models = generated("models")
        kinds_list = generated("api.jobs.job_kinds_list")
        jobs_create = generated("api.jobs.jobs_create")
        jobs_retrieve = generated("api.jobs.jobs_retrieve")
        jobs_events = generated("api.jobs.jobs_events")
        questions_list = generated("api.questions.questions_list")
        questions_answer = generated("api.questions.questions_answer")

        shop = client.AuthenticatedClient(base_url=url, token=api_token("shop", "--create"), prefix="Token")
        rita = client.AuthenticatedClient(
            base_url=url, token=api_token("rita", "--create", "--reviewer"), prefix="Token"
        )

        assert "demo.review" in {kind.name for kind in kinds_list.sync(client=shop)}
        body = models.JobSubmitDemoReview(
            kind=models.JobSubmitDemoReviewKind.DEMO_REVIEW,
            input_=models.JobSubmitDemoReviewInput(document="Q3 report"),
            idempotency_key="q3-review",
        )
        created = jobs_create.sync_detailed(client=shop, body=body)
        assert created.status_code == 201, created.content
        job = created.parsed
        assert isinstance(job, models.Job) and job.kind == "demo.review"
        again = jobs_create.sync_detailed(client=shop, body=body)  # the same key and body: the same job
        assert again.status_code == 200 and again.parsed.id == job.id

        def status() -> str:
            return str(jobs_retrieve.sync(job.id, client=shop).status)

        wait_until(lambda: status() == "paused", message="the job did not stop at its question")
        page = questions_list.sync(client=rita, job=job.id, status=models.QuestionsListStatus.OPEN)
        assert isinstance(page, models.PaginatedQuestionList) and page.count == 1
        question = page.results[0]
        assert question.key == "approve" and question.job == job.id

        answered = questions_answer.sync(
            question.id, client=rita, body=models.Answer(answer={"approved": True}, comment="fine")
        )
        assert isinstance(answered, models.Question) and str(answered.status) == "answered"
        assert answered.answered_by == "rita"

        wait_until(lambda: status() == "completed", message="the job did not complete after the answer")
        finished = jobs_retrieve.sync(job.id, client=shop)
        assert finished.result == {"approved": True, "reviewer": "rita"}
        events = jobs_events.sync(job.id, client=shop)
        assert [event.seq for event in events] == list(range(1, len(events) + 1))
        assert (events[-1].type_, events[-1].status) == (models.JobEventTypeEnum.STATUS, "completed")
