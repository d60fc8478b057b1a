"""The platform's URLs plus two bench endpoints with the same authentication, throttling, parsing
and rendering as the API (DRF's settings):

- `POST /bench/bare/`: no work of its own, so that `bench/api.py` can tell the platform's cost of a
  submit from DRF's and the server's;
- `POST /bench/floor/`: the substrate's floor of a submit (`bench/shipped.py`'s `api-floor` phase).
"""

import json
import uuid

from django.db import connection
from django.urls import path
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from taskplatform.urls import urlpatterns as platform_urlpatterns


class BareBody(serializers.Serializer):
    kind = serializers.CharField(max_length=100)
    input = serializers.JSONField(required=False)


class BareApi(APIView):
    """Validates a body shaped like a submit and answers 201 with it."""

    def post(self, request: Request) -> Response:
        body = BareBody(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(body.validated_data, status=201)


class FloorSubmit(APIView):
    """A durable submit with nothing of the platform's: the body validated as `BareApi` does; the
    job's row and its first event written in one autocommit statement, on the bench's copies of
    the platform's tables (bench/bare_durable.py); its message sent with Celery's `apply_async`
    to the bare + SQL worker, which runs the platform's two statements for it. What Django, DRF,
    PostgreSQL, Redis and Celery cost for a submit that survives a crash."""

    def post(self, request: Request) -> Response:
        from bench import bare_durable

        body = BareBody(data=request.data)
        body.is_valid(raise_exception=True)
        job_id = uuid.uuid4()
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH j AS (INSERT INTO {bare_durable.JOBS} ({bare_durable.JOB_COLUMNS}) VALUES (%s, %s, "
                f"'pending', %s::jsonb, {bare_durable.JOB_PENDING_REST}) RETURNING id, created_at) "
                f"INSERT INTO {bare_durable.EVENTS} ({bare_durable.EVENT_COLUMNS}) "
                f"SELECT id, {bare_durable.EVENT_FIRST}, created_at FROM j RETURNING created_at",
                [job_id, body.validated_data["kind"], json.dumps(body.validated_data.get("input", {}))],
            )
            created_at = cursor.fetchone()[0]
        bare_durable.run.apply_async(args=[str(job_id)], queue="durable")
        return Response({"id": str(job_id), "kind": body.validated_data["kind"], "status": "pending",
                         "created_at": created_at.isoformat()}, status=201)


urlpatterns = [path("bench/bare/", BareApi.as_view()), path("bench/floor/", FloorSubmit.as_view()),
               *platform_urlpatterns]
