"""Typed kinds: pydantic models as a kind's input and result, a question's answer, a wait's
result. The JSON Schema is derived from the model and is what the API validates against and what
OpenAPI and the admin show; the handler gets model instances; plain JSON Schemas still work."""

from __future__ import annotations

import pytest

from approvals.models import Question
from approvals.schemas import APPROVAL_SCHEMA, QuestionType, approval, question_type
from demo.kinds import BatchReviewInput, ExpenseInput, GenerateInput, ReviewInput, ReviewResult
from jobs.registry import job_kind, kind_get
from jobs.testing import run_kind
from jobs.typed import schema_of
from taskplatform.api.jsonschema30 import openapi_input_schema
from tests.api.conftest import client_for
from tests.conftest import make_user
from tests.testkinds.kinds import Billed, Invoice, Verdict

pytestmark = pytest.mark.django_db


def derived(model: type) -> dict:
    """The model's schema as a kind shows it: without the class name as its title."""
    schema = schema_of(model)
    schema.pop("title", None)
    return schema


def test_a_typed_kind_derives_its_schemas_from_its_models():
    kind = kind_get("test.typed")
    assert kind.input_model is Invoice and kind.result_model is Billed
    assert kind.input_schema == derived(Invoice)
    assert kind.input_schema["additionalProperties"] is False and "title" not in kind.input_schema
    assert kind.input_schema["properties"]["amount"] == {"exclusiveMinimum": 0, "title": "Amount", "type": "number"}
    assert kind.result_schema["required"] == ["customer", "total"]
    # An optional field is one that may be left out, not one that takes null.
    assert kind.result_schema["properties"]["note"] == {"type": "string", "title": "Note"}


def test_the_demo_kinds_are_typed_and_their_schemas_come_from_their_models():
    for name, model in [("demo.review", ReviewInput), ("demo.expense", ExpenseInput),
                        ("demo.generate", GenerateInput), ("demo.batch_review", BatchReviewInput)]:
        assert kind_get(name).input_schema == derived(model), name
    review = kind_get("demo.review").input_schema
    assert set(review["properties"]) == {"document", "required_approvals", "timeout", "valid_for"}
    assert review["required"] == ["document"]
    assert kind_get("demo.review").result_schema == derived(ReviewResult)
    assert kind_get("demo.sleep").input_model is None  # a plain JSON Schema kind


def test_the_api_validates_against_the_derived_schema_and_the_models_validators():
    api = client_for(make_user("shop"))
    kinds = {kind["name"]: kind for kind in api.get("/api/job-kinds/").json()}
    assert kinds["test.typed"]["input_schema"] == derived(Invoice)
    assert kinds["test.typed"]["result_schema"] == derived(Billed)
    assert kinds["demo.sleep"]["result_schema"] is None

    def submit(input):
        return api.post("/api/jobs/", {"kind": "test.typed", "input": input}, format="json")

    response = submit({"customer": "acme", "amount": 0})
    assert response.status_code == 400 and response.json()["field"] == "input.amount"
    response = submit({"customer": "acme", "amount": 5, "extra": 1})
    assert response.status_code == 400 and response.json()["field"] == "input"
    response = submit({"customer": "nobody", "amount": 5})  # only the model's validator refuses this one
    assert response.status_code == 400, response.json()
    assert response.json()["field"] == "input.customer" and "nobody is not a customer" in response.json()["detail"]
    assert submit({"customer": "acme", "amount": 5}).status_code == 201


def test_the_handler_gets_the_model_and_its_returned_model_is_stored_as_json():
    run = run_kind("test.typed", Invoice(customer="acme", amount=12.5))
    assert run.status == "completed", run.error
    assert run.job.input == {"customer": "acme", "amount": 12.5}
    assert run.result == {"customer": "acme", "total": 12.5}  # `note` (None) left out
    assert run.value == Billed(customer="acme", total=12.5)


def test_a_result_that_breaks_the_result_model_fails_the_job():
    run = run_kind("test.typed", {"customer": "acme", "amount": 1, "lines": ["bad result"]})
    assert run.status == "failed" and run.error["code"] == "invalid_result"
    assert "Billed" in run.error["message"] and "result.total" in run.error["message"]


def test_a_kind_may_not_take_both_a_model_and_a_schema():
    with pytest.raises(ValueError, match="not both"):
        @job_kind("test.both", input_model=Invoice, input_schema={"type": "object"})
        def both(ctx, input):  # pragma: no cover
            return {}


def test_a_typed_answer_derives_the_form_and_returns_the_model():
    run = run_kind("test.typed_ask", {"customer": "acme", "amount": 3}, answers={"verdict": Verdict(score=4)})
    assert run.result == {"score": 4, "comment": None}
    question = Question.objects.get(job=run.job)
    assert question_type(question.schema) == QuestionType.FORM
    assert question.schema["x-order"] == ["score", "comment"]
    assert question.schema["properties"]["score"] == {"maximum": 5, "minimum": 1, "title": "Score", "type": "integer"}


def test_the_form_of_a_typed_answer_is_drawn_field_by_field(client):
    from approvals.forms import answer_form_for

    run = run_kind("test.typed_ask", {"customer": "acme", "amount": 3}, answers={"verdict": {"score": 2}})
    form = answer_form_for(Question.objects.get(job=run.job))
    html = form.as_div()
    assert 'name="p_score"' in html and 'name="p_comment"' in html and "Score" in html


def test_approval_models_ask_exactly_the_hand_written_schemas():
    """A typed question's digest is the hand-written one's: paused jobs still find their answers."""
    run = run_kind("demo.review", {"document": "x"}, answers={"approve": {"approved": True}})
    assert Question.objects.get(job=run.job).schema == APPROVAL_SCHEMA
    run = run_kind("demo.expense", {"employee": "E", "amount": 1, "description": "d", "approvals": 1},
                   answers={"category": "other", "check": {"amount": 1, "receipt_attached": True},
                            "approve": {"approved": True}})
    assert Question.objects.get(job=run.job, key="approve").schema == approval()


def test_openapi_shows_each_typed_kinds_derived_schema(client):
    """The body of `POST /api/jobs/` has one variant per kind (`taskplatform.api.schema`), whose
    input is the kind's schema: for a typed kind, the one derived from its model."""
    document = client.get("/api/schema/", {"format": "json"}).json()
    schemas = document["components"]["schemas"]
    for component, model in [("JobSubmitDemoReview", ReviewInput), ("JobSubmitDemoBatchReview", BatchReviewInput),
                             ("JobSubmitDemoExpense", ExpenseInput), ("JobSubmitDemoGenerate", GenerateInput)]:
        shown = {**schemas[component]["properties"]["input"]}
        expected = {**openapi_input_schema(derived(model)).schema}
        shown.pop("description"), expected.pop("description", None)  # the variant says whose input it is
        assert shown == expected, component
    review = schemas["JobSubmitDemoReview"]["properties"]["input"]["properties"]
    assert set(review) == {"document", "required_approvals", "timeout", "valid_for"}
    assert review["timeout"]["exclusiveMinimum"] is True and review["timeout"]["minimum"] == 0
    assert review["required_approvals"]["maximum"] == 5
    assert schemas["JobSubmitDemoBatchReview"]["properties"]["input"]["properties"]["documents"]["maxItems"] == 500
