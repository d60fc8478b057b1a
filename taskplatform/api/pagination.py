"""Page-number pagination whose bad page numbers are answered like any other bad parameter."""

from __future__ import annotations

import re
from typing import Any

from django.core.paginator import InvalidPage
from rest_framework import exceptions
from rest_framework.pagination import PageNumberPagination

# Past any page or page size: a longer number is read as this (int() refuses 4,300 digits).
BEYOND = 10**18


def whole_number(raw: str) -> int:
    """`raw` as an integer when it is one in ASCII digits (the schema's `integer`; Python's int()
    also takes ` 1`, `+1`, `1_0` and the digits of other scripts), else 0."""
    if not re.fullmatch(r"[0-9]+", raw):
        return 0
    digits = raw.lstrip("0") or "0"
    return BEYOND if len(digits) > 18 else int(digits)


class ApiPagination(PageNumberPagination):
    """`?page=N&page_size=M`: `count`, `next`, `previous`, `results`.

    A page that is not a positive whole number is a 400 naming `page`; a page past the last is
    a 404 naming `page` (and saying how many pages there are).
    """

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        size = whole_number(raw)
        if not 1 <= size <= self.max_page_size:
            raise exceptions.ValidationError(
                {self.page_size_query_param: [f"must be a whole number from 1 to {self.max_page_size}"]}
            )
        return size

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list:
        number = whole_number(request.query_params.get(self.page_query_param, "1"))
        if number < 1:
            raise exceptions.ValidationError({self.page_query_param: ["must be a whole number, 1 or more"]})
        self.request = request
        paginator = self.django_paginator_class(queryset, self.get_page_size(request))
        try:
            self.page = paginator.page(number)
        except InvalidPage:
            raise exceptions.NotFound(
                f"page {number} does not exist; there are {paginator.num_pages} page(s) of results"
            ) from None
        return list(self.page)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_query_param:
                parameter["schema"]["minimum"] = 1
            elif parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_page_size)
        return parameters
