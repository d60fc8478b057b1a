"""`/jobs/` a person can use: filters by status and kind, search by id, paging, and "Submit a job",
a form drawn from the kind's input schema that goes through `job_submit` like the API (CSRF,
errors next to their fields). Through Django's test client."""

from __future__ import annotations

import re
from unittest import mock

import pytest
from django.test import Client
from django.urls import reverse
from pydantic import BaseModel, Field

from jobs.forms import JobInputForm
from jobs.models import Job
from jobs.pages import LIST_PAGE_SIZE
from jobs.registry import JobKind, kind_get
from jobs.services import job_submit, jobs_submit_many
from tests.conftest import make_user

pytestmark = pytest.mark.django_db
LIST = reverse("jobs:job-list")
SUBMIT = reverse("jobs:job-submit")


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.transitions.job_dispatch"):
        yield


@pytest.fixture
def olga(client):
    user = make_user("olga")
    client.force_login(user)
    return user


def listed(client, **query) -> list[str]:
    page = client.get(LIST, query).content.decode()
    return re.findall(r'<tr data-job-id="([0-9a-f-]+)"', page)


def test_the_list_filters_by_status_and_kind_and_finds_a_job_by_its_id(client, olga):
    sleep, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1}, owner=olga)
    noop, _ = job_submit(kind="demo.noop", input={}, owner=olga)
    Job.objects.filter(pk=noop.pk).update(status="completed")
    theirs, _ = job_submit(kind="demo.noop", input={}, owner=make_user("sam"))
    assert set(listed(client)) == {str(sleep.pk), str(noop.pk)}
    assert listed(client, status="completed") == [str(noop.pk)]
    assert listed(client, kind="demo.sleep") == [str(sleep.pk)]
    assert listed(client, status="pending", kind="demo.noop") == []
    assert listed(client, q=str(sleep.pk)[:8]) == [str(sleep.pk)]  # the short id the pages show
    assert listed(client, q=str(sleep.pk).upper()) == [str(sleep.pk)]  # the whole id, any case
    assert listed(client, q=str(theirs.pk)) == []  # never another user's job
    assert listed(client, q="not-an-id") == []
    page = client.get(LIST, {"status": "completed"}).content.decode()
    assert '<option value="completed" selected>' in page and "show all" in page
    assert 'data-filter-status="completed"' in page  # pushed jobs join only when they match


def test_the_list_pages_through_every_job(client, olga):
    jobs_submit_many(kind="demo.noop", inputs=[{}] * (LIST_PAGE_SIZE + 5), owner=olga)
    first = client.get(LIST).content.decode()
    assert len(re.findall(r"<tr data-job-id=", first)) == LIST_PAGE_SIZE
    assert "page 1 of 2" in first and 'href="?page=2"' in first and 'data-insert="1"' in first
    second = client.get(LIST, {"page": 2}).content.decode()
    assert len(re.findall(r"<tr data-job-id=", second)) == 5 and 'data-insert=""' in second
    both = set(re.findall(r'<tr data-job-id="([^"]+)"', first)) | set(re.findall(r'<tr data-job-id="([^"]+)"', second))
    assert len(both) == LIST_PAGE_SIZE + 5
    assert 'href="?kind=demo.noop&amp;page=2"' in client.get(LIST, {"kind": "demo.noop"}).content.decode()


def test_the_submit_form_is_drawn_from_the_kinds_input_schema(client, olga):
    page = client.get(LIST, {"submit_kind": "demo.sleep"}).content.decode()
    form = page[page.index('id="job-submit-form"'):]
    assert re.search(r'<input type="number" name="in_seconds"[^>]*max="3600"[^>]*required', form)
    assert re.search(r'<input type="number" name="in_steps"[^>]*min="1"[^>]*required', form)
    assert 'name="csrfmiddlewaretoken"' in form and '<input type="hidden" name="kind" value="demo.sleep">' in form
    review = client.get(LIST, {"submit_kind": "demo.review"}).content.decode()
    assert 'name="in_document"' in review
    batch = client.get(LIST, {"submit_kind": "test.lines"}).content.decode()
    assert "One per line." in batch and '<textarea name="in_documents"' in batch
    anything = client.get(LIST, {"submit_kind": "test.ask"}).content.decode()  # {"type": "object"}: JSON
    assert '<textarea name="input_json"' in anything


def test_submitting_goes_through_job_submit_and_opens_the_job(client, olga):
    with mock.patch("jobs.pages.job_submit", wraps=job_submit) as service:
        response = client.post(SUBMIT, {"kind": "demo.sleep", "in_seconds": "2.5", "in_steps": "4"})
    job = Job.objects.get(kind="demo.sleep")
    service.assert_called_once_with(kind="demo.sleep", input={"seconds": 2.5, "steps": 4}, owner=olga)
    assert response.status_code == 302 and response["Location"] == reverse("jobs:job-detail", args=[job.pk])
    assert job.owner == olga and job.status == "pending"
    batch = client.post(SUBMIT, {"kind": "test.lines", "in_documents": "Q3 report\n\n  Q4 plan \n"})
    assert batch.status_code == 302
    assert Job.objects.get(kind="test.lines").input == {"documents": ["Q3 report", "Q4 plan"], "urgent": False}


def test_errors_come_back_next_to_their_fields(client, olga):
    refused = client.post(SUBMIT, {"kind": "demo.sleep", "in_seconds": "5", "in_steps": "0"})
    assert refused.status_code == 400
    page = refused.content.decode()
    steps = page[page.index('class="field field-in_steps'):]
    assert "has-errors" in page[page.index('class="field field-in_steps'):][:60]
    assert "greater than or equal to 1" in steps[:steps.index("</div>")]
    assert 'value="5"' in page  # what was typed stays
    # An error only the schema knows (exclusiveMinimum), reported by job_submit, lands by its field too.
    refused = client.post(SUBMIT, {"kind": "demo.expense", "in_employee": "Dana", "in_amount": "0",
                                   "in_description": "Train"})
    page = refused.content.decode()
    amount = page[page.index('class="field field-in_amount'):]
    assert refused.status_code == 400 and "less than or equal to the minimum of 0" in amount[:amount.index("</div>")]
    bad_json = client.post(SUBMIT, {"kind": "test.ask", "input_json": "{nope"})
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.content.decode()
    unknown = client.post(SUBMIT, {"kind": "no.such.kind"}, follow=True)
    assert "unknown job kind" in unknown.content.decode()
    assert Job.objects.count() == 0


def test_submitting_needs_a_login_and_the_csrf_token():
    anonymous = Client().post(SUBMIT, {"kind": "demo.noop"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_user("olga"))
    assert strict.post(SUBMIT, {"kind": "demo.noop"}).status_code == 403
    assert Job.objects.count() == 0


class Invoice(BaseModel):
    customer: str = Field(description="Who pays")
    amount: float = Field(gt=0)
    currency: str = "EUR"
    rush: bool = False
    note: str | None = None


def test_a_typed_kinds_model_gives_the_same_fields():
    """A kind whose input is a pydantic model publishes the model's JSON Schema: optional values
    (`anyOf` with null) and defaults are read as fields too."""
    kind = JobKind(name="billing.invoice", handler=lambda ctx, input: None,
                   input_schema=Invoice.model_json_schema())
    form = JobInputForm(kind)
    assert list(form.fields) == ["in_customer", "in_amount", "in_currency", "in_rush", "in_note"]
    assert form.fields["in_customer"].required and not form.fields["in_note"].required
    assert form.fields["in_currency"].initial == "EUR" and form.fields["in_customer"].help_text == "Who pays"
    bound = JobInputForm(kind, {"in_customer": "ACME", "in_amount": "12.5", "in_currency": "EUR"})
    assert bound.is_valid(), bound.errors
    assert bound.value() == {"customer": "ACME", "amount": 12.5, "currency": "EUR", "rush": False}
    Invoice.model_validate(bound.value())
    noop = JobInputForm(kind_get("demo.noop"))
    assert not noop.fields and not noop.as_json
