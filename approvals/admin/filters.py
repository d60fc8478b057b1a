"""The inbox's filters: whose questions (waiting for me by default), assignee, deadline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from approvals.models import Question
from approvals.selectors import ANSWER_PERMISSION, questions_answerable_by, questions_waiting_for


class InboxFilter(admin.SimpleListFilter):
    """Opens on "waiting for me" (open, assigned to me, not yet approved by me) for reviewers,
    on "all" for staff who may not answer."""

    title = "inbox"
    parameter_name = "inbox"
    WAITING, MINE, ALL = "waiting", "mine", "all"

    def __init__(self, request: HttpRequest, params: Any, model: Any, model_admin: Any) -> None:
        self.default = self.WAITING if request.user.has_perm(ANSWER_PERMISSION) else self.ALL
        super().__init__(request, params, model, model_admin)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (self.WAITING, "Waiting for me (assigned to me and open)"),
            (self.MINE, "Assigned to me (any status)"),
            (self.ALL, "All questions"),
        ]

    def value(self) -> str:
        return super().value() or self.default

    def choices(self, changelist: Any):
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Question]) -> QuerySet[Question]:
        if self.value() == self.WAITING:
            return queryset.filter(pk__in=questions_waiting_for(request.user).values("pk"))
        if self.value() == self.MINE:
            return queryset.filter(pk__in=questions_answerable_by(request.user).values("pk"))
        return queryset


class AssigneeFilter(admin.SimpleListFilter):
    """Questions assigned to a group, or to a user directly."""

    title = "assignee"
    parameter_name = "assignee"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        groups = Group.objects.filter(assigned_questions__isnull=False).distinct().order_by("name")
        users = get_user_model().objects.filter(assigned_questions__isnull=False).distinct().order_by("username")
        return [(f"group:{g.pk}", f"group {g.name}") for g in groups] + [(f"user:{u.pk}", u.get_username())
                                                                          for u in users]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Question]) -> QuerySet[Question]:
        kind, _, pk = (self.value() or "").partition(":")
        if not pk.isdigit():
            return queryset
        if kind == "group":
            return queryset.filter(assigned_groups=pk)
        return queryset.filter(assigned_users=pk)


class DeadlineFilter(admin.SimpleListFilter):
    title = "deadline"
    parameter_name = "deadline"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("overdue", "past its deadline"), ("1h", "within an hour"), ("24h", "within a day"),
                ("any", "has a deadline"), ("none", "no deadline")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Question]) -> QuerySet[Question]:
        now = timezone.now()
        value = self.value()
        if value == "overdue":
            return queryset.filter(expires_at__lte=now)
        if value in ("1h", "24h"):
            within = timedelta(hours=1 if value == "1h" else 24)
            return queryset.filter(expires_at__gt=now, expires_at__lte=now + within)
        if value == "any":
            return queryset.filter(expires_at__isnull=False)
        if value == "none":
            return queryset.filter(expires_at__isnull=True)
        return queryset
