"""Accounts: API tokens and the demo accounts of `make run`."""

from __future__ import annotations

import hashlib
import secrets
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connections, transaction
from django.db.models.query import get_related_populators
from django.utils import timezone

from accounts.credentials import credential_revoked
from accounts.models import ApiToken

REVIEWERS_GROUP = "reviewers"


def token_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_token_create(*, user: Any, name: str = "") -> tuple[ApiToken, str]:
    """Make a token for `user`; return it and its key (shown once, stored only as a hash)."""
    key = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, key_hash=token_hash(key), prefix=key[:8])
    return token, key


# Every API request looks its token up, and building that one statement through the ORM (the
# queryset, its joins, compiling) cost more CPU than sending it. So, per database connection, the
# ORM builds it once with a stand-in hash; the text is kept with the place of the hash in its
# parameters, and each lookup runs it with its own hash. The rows become a token and its user
# through the same compiler, converters and populators a queryset uses.
_STAND_IN_HASH = "kept-statement:token-hash"


def _token_lookup_statement(connection: Any) -> tuple[str, list, int, Any, list[str], slice, list]:
    kept = connection.__dict__.setdefault("_taskplatform_token_lookup", [])
    if not kept:
        rows = ApiToken.objects.using(connection.alias).select_related("user").order_by()
        compiler = rows.filter(key_hash=_STAND_IN_HASH, revoked_at__isnull=True).query.get_compiler(
            connection=connection)
        sql, params = compiler.as_sql()
        klass_info, select = compiler.klass_info, compiler.select
        fields = slice(klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1)
        init_list = [column[0].target.attname for column in select[fields]]
        kept.append((sql, list(params), list(params).index(_STAND_IN_HASH), compiler, init_list, fields,
                     get_related_populators(klass_info, select, connection.alias)))
    return kept[0]


def _token_active(key_hash: str) -> ApiToken | None:
    """The unrevoked token whose key hashes to `key_hash`, its user with it, or None (one statement)."""
    connection = connections[ApiToken.objects.db]
    sql, params, slot, compiler, init_list, fields, populators = _token_lookup_statement(connection)
    params = [*params]
    params[slot] = key_hash
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchmany(2)
    for row in compiler.results_iter(results=[rows]):
        token = ApiToken.from_db(connection.alias, init_list, row[fields])
        for populator in populators:
            populator.populate(row, token)
        return token
    return None


def api_token_authenticate(*, key: str) -> ApiToken | None:
    """The active token whose key is `key` (its user active too), or None. Marks it used."""
    token = _token_active(token_hash(key))
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    # Write last-used at most once a minute: a busy token must not turn every request into a write.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def api_token_revoke(*, token: ApiToken) -> None:
    """Revoke `token`: refused from now on, and the live streams opened with it (websockets by
    its tickets, SSE streams) are closed in every web process once the revocation commits."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        transaction.on_commit(partial(credential_revoked.send_robust, sender=ApiToken, kind="token",
                                      id=str(token.pk)), robust=True)


@transaction.atomic
def user_ensure(*, username: str, password: str | None = None, superuser: bool = False,
                staff: bool = False, reviewer: bool = False) -> tuple[Any, bool]:
    """Get or create `username` with the given roles; return (user, created)."""
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username)
    if created:
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.is_superuser = superuser
        user.is_staff = staff or superuser
        user.save()
    if reviewer:
        user.groups.add(Group.objects.get(name=REVIEWERS_GROUP))
    return user, created
