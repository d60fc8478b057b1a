"""The `{id}` of the API's detail routes: a UUID, as the document says (`format: uuid`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiTypes
from rest_framework import exceptions
from rest_framework.request import Request

from jobs.serializers import UUID_TEXT

# Documents the `{id}` of a detail operation.
ID = OpenApiParameter("id", OpenApiTypes.UUID, location=OpenApiParameter.PATH, description="The object's id.")


class UUIDLookup:
    """A viewset mixin: a detail route's `{id}` that is not a UUID in its usual text is a 404, as
    an unknown id is. The route itself takes any segment (`lookup_value_regex`), so that the
    answer is the API's JSON 404; and Django's lookup alone would also find the object under
    other spellings (32 hex digits, braces, a URN), which the document does not allow."""

    lookup_value_regex = "[^/]+"

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication first: 401 before 404
        pk = kwargs.get("pk")
        if pk is not None and not UUID_TEXT.fullmatch(pk):
            raise exceptions.NotFound(f"{pk} is not an id; ids are UUIDs, such as 8c1e6a0e-3b1f-4f6e-9d2a-7a4f2b9c0d11")
