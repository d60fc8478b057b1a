""""Assigned to this user": a row's many-to-many assignees (users, and groups whose members
count), as a condition that PostgreSQL checks row by row, for a read of one row or a few, or as it
likes, for a list or a count over many.

The plain form, `EXISTS (SELECT 1 FROM assigned_users WHERE question_id = outer.id AND
user_id = …)`, is one PostgreSQL may rewrite as `outer.id = ANY (SELECT question_id … WHERE
user_id = …)` and run as a hashed set of *every* row ever assigned to that user, or to any of
their groups, built again for each statement. It did so for a single question read by its id:
with 11,000 questions assigned to a reviewers group, reading one of them as a reviewer took 40 ms,
and grew with every question asked (bench/README.md, "A reviewer's reads at scale").

Here each EXISTS reaches its row only through a subquery of its own (`… WHERE user_id = … AND
group_id IN (SELECT group_id FROM assigned_groups WHERE question_id = outer.id)`). PostgreSQL
cannot turn that into a set, so it checks each row it is asked about, through the assignment
tables' index on the row: the same few index reads at any size. A list or a count checks every
row anyway, and there the sets are cheaper (`per_row=False`).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists, Model, OuterRef, Q


def assigned_to_user(*, users: type[Model], groups: type[Model], row_field: str, user: Any,
                     per_row: bool = True) -> Q:
    """The condition "`user` is one of the row's assignees, directly or through one of their
    groups", for a filter (or, wrapped, an annotation) of the model whose many-to-many through
    models are `users` (fields `row_field`, `user_id`) and `groups` (`row_field`, `group_id`).

    `per_row` (the default): checked row by row, whatever the table's size: for reads of one row
    or a few. False: the plain correlated EXISTS, left to the planner, which may build the hashed
    sets: cheaper for a count or a list over many rows (the reviewer's inbox), where every row is
    checked anyway (bench/visibility.py: the inbox's count of 30,000 open questions took 49 ms
    this way and 102 ms row by row)."""
    if not per_row:
        by_user = users.objects.filter(**{row_field: OuterRef("pk")}, user_id=user.pk)
        by_group = groups.objects.filter(**{row_field: OuterRef("pk")}, group__user=user.pk)
        return Q(Exists(by_user)) | Q(Exists(by_group))
    row = OuterRef(OuterRef("pk"))
    user_model = get_user_model()
    directly = user_model.objects.filter(
        pk=user.pk, pk__in=users.objects.filter(**{row_field: row}).values("user_id"))
    member = user_model.groups.through.objects.filter(
        user_id=user.pk, group_id__in=groups.objects.filter(**{row_field: row}).values("group_id"))
    return Q(Exists(directly)) | Q(Exists(member))
