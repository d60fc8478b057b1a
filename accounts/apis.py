"""`POST /api/ws-tickets/`: a ticket for one websocket connection (`accounts.tickets`)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import ApiToken
from accounts.tickets import ws_ticket_issue
from taskplatform.api.errors import RETRY_AFTER, error_responses
from taskplatform.timestamps import iso_utc


class WsTicketApi(APIView):
    """A short-lived, single-use ticket to open one websocket with (`?ticket=`)."""

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
