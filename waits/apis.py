"""`POST /api/wake/{token}/`: an outside service's callback for a parked job.

No credential but the token itself (a 256-bit secret, usable once): the callback is a signal,
not a payload, so the worst a forged or replayed one can do is cause one early check.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api_errors import ErrorSerializer
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
