"""The platform's URLs plus `POST /bench/bare/`: a DRF endpoint with the same authentication,
throttling, parsing and rendering as the API but no work of its own, so that `bench/api.py` can
tell the platform's cost of a submit from DRF's and the server's."""

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


urlpatterns = [path("bench/bare/", BareApi.as_view()), *platform_urlpatterns]
