"""The waits API: an outside service's callback, and people standing in for a service.

`POST /api/wake/{token}/`: no credential but the token itself (a 256-bit secret, usable once):
the callback is a signal, not a payload, so the worst a forged or replayed one can do is cause
one early check.

`/api/waits/`: the waits of the jobs the caller may see; on a combined wait, a person allowed to
act (`waits.people.wait_check_can_act`, the rule of questions) provides the result, retries the
submit or fails the wait, through the same services as the admin and the job's page.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.services import request_client_address
from jobs.api_errors import RETRY_AFTER, ErrorSerializer, error_responses
from jobs.api_lookups import NUMBER_ID, NumberLookup
from waits.models import Wait
from waits.people import wait_fail, wait_provide, wait_retry_submit
from waits.selectors import wait_get_visible, waits_visible_to
from waits.serializers import (
    FailSerializer,
    ProvideSerializer,
    RetrySerializer,
    WaitDecisionSerializer,
    WaitListQuerySerializer,
    WaitSerializer,
)
from waits.services import wake_token_redeem


class WakeApi(APIView):
    """Wake the job parked on this token."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    # Per-token rate limits count API tokens; a wake token is guessed at no useful rate (256 bits).
    throttle_classes: list = []

    @extend_schema(
        operation_id="wake",
        summary="Wake a parked job (an outside service's callback)",
        request=None,
        responses={
            202: inline_serializer("WakeAccepted", {"status": serializers.CharField()}),
            404: OpenApiResponse(ErrorSerializer, description="Unknown, used or expired token."),
        },
        auth=[],
        tags=["waits"],
    )
    def post(self, request: Request, token: str) -> Response:
        wake_token_redeem(token=token)
        return Response({"status": "accepted"}, status=status.HTTP_202_ACCEPTED)


RACE = ("409: something came first and the wait ended (`wait_ended`: the callback's result, a check, another "
        "person or the deadline, named in `detail`), or the job is not parked on it right now (`wait_busy`: a "
        "callback or a check woke it and it is looking at the service; act again if it parks again). 403: the "
        "caller may not act (no `approvals.answer_question` permission, not an assignee, their own job, or a wait "
        "without a person).")


@extend_schema_view(
    list=extend_schema(
        summary="List the waits of the jobs visible to the caller",
        parameters=[WaitListQuerySerializer, RETRY_AFTER],
        responses={200: WaitSerializer(many=True), **error_responses(400, 404)},
        tags=["waits"],
    ),
    retrieve=extend_schema(  # NUMBER_ID: the `{id}` is a whole number
        summary="Get a wait",
        parameters=[NUMBER_ID, RETRY_AFTER],
        responses={200: WaitSerializer, **error_responses(404)},
        tags=["waits"],
    ),
)
class WaitViewSet(NumberLookup, viewsets.GenericViewSet):
    """Waits on outside work; a combined wait may be ended by a person."""

    serializer_class = WaitSerializer

    def get_queryset(self) -> QuerySet[Wait]:
        return waits_visible_to(self.request.user).prefetch_related("assigned_users", "assigned_groups")

    def list(self, request: Request) -> Response:
        query = WaitListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        waits = self.get_queryset()
        if "job" in query.validated_data:
            waits = waits.filter(job_id=query.validated_data["job"])
        if "state" in query.validated_data:
            waits = waits.filter(state=query.validated_data["state"])
        page = self.paginate_queryset(waits.order_by("-created_at", "-pk"))
        return self.get_paginated_response(WaitSerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(WaitSerializer(wait_get_visible(user=request.user, wait_id=pk)).data)

    @extend_schema(
        operation_id="waits_provide",
        summary="Provide the result of a combined wait (the job resumes with it)",
        description="400: the result breaks the wait's `person.schema` (`field` names where). " + RACE,
        request=ProvideSerializer,
        parameters=[NUMBER_ID, RETRY_AFTER],
        responses={200: WaitSerializer, **error_responses(400, 403, 404, 409)},
        tags=["waits"],
    )
    @action(detail=True, methods=["post"])
    def provide(self, request: Request, pk: str) -> Response:
        wait = wait_get_visible(user=request.user, wait_id=pk)
        body = ProvideSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wait = wait_provide(wait_id=wait.pk, user=request.user, result=body.validated_data["result"],
                            comment=body.validated_data["comment"], via="api",
                            client_address=request_client_address(request))
        return Response(WaitSerializer(wait).data)

    @extend_schema(
        operation_id="waits_retry",
        summary="Retry the submit of a combined wait (the service lost the work)",
        description="A new wake token (the old one no longer wakes anything), the marks start again, the "
        "deadline stays; the job resumes and submits again. " + RACE,
        request=RetrySerializer,
        parameters=[NUMBER_ID, RETRY_AFTER],
        responses={200: WaitSerializer, **error_responses(400, 403, 404, 409)},
        tags=["waits"],
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        wait = wait_get_visible(user=request.user, wait_id=pk)
        body = RetrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wait = wait_retry_submit(wait_id=wait.pk, user=request.user, comment=body.validated_data["comment"],
                                 via="api", client_address=request_client_address(request))
        return Response(WaitSerializer(wait).data)

    @extend_schema(
        operation_id="waits_fail",
        summary="Fail a combined wait with a reason (the job fails with `failed_by_person`)",
        description="400: no reason. " + RACE,
        request=FailSerializer,
        parameters=[NUMBER_ID, RETRY_AFTER],
        responses={200: WaitSerializer, **error_responses(400, 403, 404, 409)},
        tags=["waits"],
    )
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        wait = wait_get_visible(user=request.user, wait_id=pk)
        body = FailSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wait = wait_fail(wait_id=wait.pk, user=request.user, reason=body.validated_data["reason"], via="api",
                         client_address=request_client_address(request))
        return Response(WaitSerializer(wait).data)

    @extend_schema(
        operation_id="waits_decisions",
        summary="The wait's ledger, oldest first",
        description="What ended the wait and through which channel (`callback`, `check`, `person`, `deadline`, "
        "`system`), escalations, and people's actions refused because something came first. Never changed.",
        parameters=[NUMBER_ID, RETRY_AFTER],
        responses={200: WaitDecisionSerializer(many=True), **error_responses(404)},
        tags=["waits"],
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def decisions(self, request: Request, pk: str) -> Response:
        wait = wait_get_visible(user=request.user, wait_id=pk)
        return Response(WaitDecisionSerializer(wait.decisions.order_by("created_at", "id"), many=True).data)
