"""Sign-in and permissions: Django's ModelBackend, with a user's permissions read in one query.

Django's own reads a user's permissions in two queries, their own and their groups', the first
time a request asks `has_perm`. Every answer, inbox and admin page asks it, so that is a round
trip each; here both halves are one UNION, its statement built once per connection. Nothing else
changes: the same rules (inactive users have none, superusers have all), the same per-request
cache on the user object (`_perm_cache`), so a permission taken away applies from the next
request on.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend as DjangoModelBackend
from django.contrib.auth.models import Permission

from dbkit.kept import KeptRead

_FIELDS = ("content_type__app_label", "codename")


def _own_and_groups(user_id: Any) -> Any:
    own = Permission.objects.filter(user=user_id).order_by().values_list(*_FIELDS)
    return own.union(Permission.objects.filter(group__user=user_id).order_by().values_list(*_FIELDS))


# Built by the ORM once per connection (dbkit.kept): an answer asks it every time. The stand-in is
# no user's id.
_OWN_AND_GROUPS = KeptRead(_own_and_groups, stand_ins=(-1,))


class ModelBackend(DjangoModelBackend):
    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            if user_obj.is_superuser:
                rows = Permission.objects.values_list(*_FIELDS)
            else:
                rows = _OWN_AND_GROUPS.rows(user_obj.pk, using=Permission.objects.db)
            user_obj._perm_cache = {f"{app_label}.{codename}" for app_label, codename in rows}
        return user_obj._perm_cache
