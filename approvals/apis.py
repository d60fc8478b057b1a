"""The questions API: list, retrieve, answer.

Reads go through `approvals.selectors` (a question the caller may not see is a 404); an answer
goes through `approvals.services.question_answer`, the same function and permission check as
the admin's answer form.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from approvals.models import Question
from approvals.selectors import (
    question_decisions,
    question_get_visible,
    question_visible_job_id,
    questions_visible_to,
    with_approvals,
)
from approvals.serializers import (
    AnswerSerializer,
    DecisionSerializer,
    QuestionListQuerySerializer,
    QuestionSerializer,
)
from approvals.services import question_answer, request_client_address
from jobs.api_errors import RETRY_AFTER, error_responses
from jobs.api_lookups import ID, UUIDLookup


@extend_schema_view(
    list=extend_schema(
        summary="List the questions visible to the caller",
        parameters=[QuestionListQuerySerializer, RETRY_AFTER],
        responses={200: QuestionSerializer(many=True), **error_responses(400, 404)},
    ),
    retrieve=extend_schema(
        summary="Get a question",
        parameters=[ID, RETRY_AFTER],
        responses={200: QuestionSerializer, **error_responses(404)},
    ),
)
class QuestionViewSet(UUIDLookup, viewsets.GenericViewSet):
    """Questions: a reviewer sees those they may answer; a job's creator sees its questions;
    staff see all."""

    serializer_class = QuestionSerializer

    def get_queryset(self) -> QuerySet[Question]:
        return with_approvals(
            questions_visible_to(self.request.user)
            .select_related("answered_by")
            .prefetch_related("assigned_users", "assigned_groups")
        )

    def list(self, request: Request) -> Response:
        query = QuestionListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        questions = self.get_queryset()
        if "status" in query.validated_data:
            questions = questions.filter(status=query.validated_data["status"])
        if "job" in query.validated_data:
            questions = questions.filter(job_id=query.validated_data["job"])
        page = self.paginate_queryset(questions.order_by("-created_at", "-pk"))
        return self.get_paginated_response(QuestionSerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(QuestionSerializer(question_get_visible(user=request.user, question_id=pk)).data)

    @extend_schema(
        operation_id="questions_answer",
        summary="Answer an open question (the job resumes)",
        description="400: the answer breaks the question's `schema` (`field` names where); 403: the caller may "
        "not answer it (no permission, not an assignee, or their own job); 409: already answered (naming who), "
        "already approved by the caller (a quorum waits for other reviewers) or no longer open. For a quorum "
        "question an approval is a vote: the question stays `open` until `required_approvals` reviewers approved.",
        request=AnswerSerializer,
        examples=[
            OpenApiExample(
                "An approval",
                value={"answer": {"approved": True}, "comment": "Checked the figures."},
                request_only=True,
            )
        ],
        parameters=[ID, RETRY_AFTER],
        responses={200: QuestionSerializer, **error_responses(400, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def answer(self, request: Request, pk: str) -> Response:
        job_id = question_visible_job_id(user=request.user, question_id=pk)  # 404 before 400
        body = AnswerSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        question = question_answer(
            question_id=pk,
            user=request.user,
            answer=body.validated_data["answer"],
            comment=body.validated_data["comment"],
            channel="api",
            client_address=request_client_address(request),
            job_id=job_id,
        )
        return Response(QuestionSerializer(question).data)

    @extend_schema(
        operation_id="questions_decisions",
        summary="The question's decision ledger, oldest first",
        description="Every answer, vote, expiry, escalation, cancellation and re-opening, with who, the channel, "
        "the client address and the digest of what was shown. Rows are never changed or removed.",
        parameters=[ID, RETRY_AFTER],
        responses={200: DecisionSerializer(many=True), **error_responses(404)},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def decisions(self, request: Request, pk: str) -> Response:
        question = question_get_visible(user=request.user, question_id=pk)
        return Response(DecisionSerializer(question_decisions(question), many=True).data)
