"""The jobs API: job kinds, submit, list, retrieve, cancel, retry, the event log, and tickets for
the live websockets.

Views only translate HTTP: they read through `jobs.selectors` (so anything the caller may not
see is a 404) and write through `jobs.services`. Errors are PlatformError subclasses, turned
into responses by `jobs.api_errors.api_exception_handler`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F, Prefetch, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import ApiToken
from accounts.tickets import ws_ticket_issue
from jobs.api_errors import RETRY_AFTER, error_responses
from jobs.api_lookups import ID, UUIDLookup
from jobs.errors import NotAllowed
from jobs.models import Job
from jobs.registry import kinds_all
from jobs.selectors import job_events_after, job_get_visible, job_may_manage, jobs_visible_to
from jobs.serializers import (
    JobEventSerializer,
    JobEventsQuerySerializer,
    JobKindSerializer,
    JobListQuerySerializer,
    JobSerializer,
    JobSubmitSerializer,
)
from jobs.services import job_cancel, job_retry, job_submit
from jobs.timestamps import iso_utc

# A page of jobs reads the ids of their children in one query.
JOB_CHILDREN = Prefetch("children", queryset=Job.objects.only("id", "parent_id", "created_at"))


class JobKindListApi(APIView):
    """The registered job kinds with their input schemas."""

    @extend_schema(
        operation_id="job_kinds_list",
        summary="List the job kinds",
        parameters=[RETRY_AFTER],
        responses={200: JobKindSerializer(many=True), **error_responses()},
        tags=["jobs"],
    )
    def get(self, request: Request) -> Response:
        kinds = [
            {"name": kind.name, "description": kind.description, "input_schema": kind.input_schema,
             "result_schema": kind.result_schema}
            for kind in kinds_all()
        ]
        return Response(JobKindSerializer(kinds, many=True).data)


def jobs_filter(queryset: QuerySet[Job], filters: dict[str, Any]) -> QuerySet[Job]:
    """Apply the validated filters and ordering of `GET /api/jobs/` to `queryset`."""
    if "status" in filters:
        queryset = queryset.filter(status=filters["status"])
    if "kind" in filters:
        queryset = queryset.filter(kind=filters["kind"])
    if "created_after" in filters:
        queryset = queryset.filter(created_at__gte=filters["created_after"])
    if "created_before" in filters:
        queryset = queryset.filter(created_at__lt=filters["created_before"])
    ordering = filters["ordering"]
    name = ordering.lstrip("-")
    # Nulls (a job not started or not finished yet) last either way; the id keeps pages stable.
    key = F(name).desc(nulls_last=True) if ordering.startswith("-") else F(name).asc(nulls_last=True)
    return queryset.order_by(key, "-pk" if ordering.startswith("-") else "pk")


@extend_schema_view(
    list=extend_schema(
        summary="List the jobs visible to the caller",
        parameters=[JobListQuerySerializer, RETRY_AFTER],
        responses={200: JobSerializer(many=True), **error_responses(400, 404)},
    ),
    retrieve=extend_schema(
        summary="Get a job",
        parameters=[ID, RETRY_AFTER],
        responses={200: JobSerializer, **error_responses(404)},
    ),
    create=extend_schema(
        summary="Submit a job",
        description="201 with a new job; with an `idempotency_key` already used by the caller, 200 and that "
        "job when the body is the same, 409 when it is not. 400 names the failing field (`kind`, `input.…`).",
        request=JobSubmitSerializer,
        parameters=[RETRY_AFTER],
        responses={
            201: OpenApiResponse(JobSerializer, description="A new job."),
            200: OpenApiResponse(JobSerializer, description="The job an earlier request with this key made."),
            **error_responses(400, 409),
        },
    ),
)
class JobViewSet(UUIDLookup, viewsets.GenericViewSet):
    """Jobs: a caller sees the jobs they created, those with a question they may answer, and all
    of them when staff."""

    serializer_class = JobSerializer

    def get_queryset(self) -> QuerySet[Job]:
        return jobs_visible_to(self.request.user)

    def list(self, request: Request) -> Response:
        query = JobListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        jobs = jobs_filter(self.get_queryset(), query.validated_data)
        page = self.paginate_queryset(jobs.prefetch_related(JOB_CHILDREN))
        return self.get_paginated_response(JobSerializer(page, many=True).data)

    def create(self, request: Request) -> Response:
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job, created = job_submit(
            kind=body.validated_data["kind"],
            input=body.validated_data["input"],
            owner=request.user,
            idempotency_key=body.validated_data.get("idempotency_key"),
        )
        if created:  # a job made just now has no children yet: no query to say so
            job._prefetched_objects_cache = {"children": []}
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(JobSerializer(job_get_visible(user=request.user, job_id=pk)).data)

    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job that has not finished",
        description="Open questions of the job are cancelled with it. Only the job's creator or staff may cancel.",
        request=None,
        parameters=[ID, RETRY_AFTER],
        responses={200: JobSerializer, **error_responses(403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        job = self._job_to_manage(request, pk)
        return Response(JobSerializer(job_cancel(job_id=job.pk, actor=request.user, channel="api")).data)

    @extend_schema(
        operation_id="jobs_retry",
        summary="Run a failed or cancelled job again",
        description="Finished steps stay checkpointed; the job gets a fresh budget of attempts. "
        "Only the job's creator or staff may retry.",
        request=None,
        parameters=[ID, RETRY_AFTER],
        responses={200: JobSerializer, **error_responses(403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        job = self._job_to_manage(request, pk)
        return Response(JobSerializer(job_retry(job_id=job.pk, actor=request.user)).data)

    @extend_schema(
        operation_id="jobs_events",
        summary="The job's events after a seq, oldest first",
        description="Page on with `after` = the last `seq` received. A plain JSON list, not paginated.",
        parameters=[ID, JobEventsQuerySerializer, RETRY_AFTER],
        responses={200: JobEventSerializer(many=True), **error_responses(400, 404)},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request: Request, pk: str) -> Response:
        job = job_get_visible(user=request.user, job_id=pk)
        query = JobEventsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        events = job_events_after(job_id=job.pk, after=params["after"], limit=params["limit"])
        return Response(JobEventSerializer(events, many=True).data)

    def _job_to_manage(self, request: Request, pk: str) -> Job:
        job = job_get_visible(user=request.user, job_id=pk)
        if not job_may_manage(user=request.user, job=job):
            raise NotAllowed(
                f"only the job's creator or staff may cancel or retry job {job.pk}; "
                f"{request.user.get_username()!r} sees it as a reviewer of its questions"
            )
        return job


class WsTicketApi(APIView):
    """A short-lived, single-use ticket to open one websocket with (`?ticket=`, `accounts.tickets`)."""

    @extend_schema(
        operation_id="ws_ticket_create",
        summary="Get a ticket for one websocket connection",
        description=(
            "Answers a ticket good for one connection to `/ws/jobs/…?ticket=TICKET`, expiring within 60 s. "
            "Websockets never take an API key in their URL."
        ),
        request=None,
        parameters=[RETRY_AFTER],
        responses={
            201: inline_serializer("WsTicket", {"ticket": serializers.CharField(),
                                                "expires_at": serializers.DateTimeField()}),
            **error_responses(),
        },
        tags=["live"],
    )
    def post(self, request: Request) -> Response:
        if isinstance(request.auth, ApiToken):
            credential = ("token", str(request.auth.pk))
        else:  # a browser session
            credential = ("session", request.session.session_key or "")
        ticket, expires_at = ws_ticket_issue(user=request.user, credential=credential)
        return Response({"ticket": ticket, "expires_at": iso_utc(expires_at)}, status=status.HTTP_201_CREATED)
