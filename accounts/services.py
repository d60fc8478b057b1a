"""Accounts: API tokens and the demo accounts of `make run`."""

from __future__ import annotations

import hashlib
import secrets
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from accounts.credentials import credential_revoked
from accounts.models import ApiToken
from dbkit.kept import KeptRead

REVIEWERS_GROUP = "reviewers"


def token_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_token_create(*, user: Any, name: str = "") -> tuple[ApiToken, str]:
    """Make a token for `user`; return it and its key (shown once, stored only as a hash)."""
    key = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, key_hash=token_hash(key), prefix=key[:8])
    return token, key


# Every API request looks its token up: the statement is built once per connection (dbkit.kept).
_TOKEN_ACTIVE = KeptRead(
    lambda key_hash: ApiToken.objects.select_related("user").filter(key_hash=key_hash, revoked_at__isnull=True)
    .order_by()[:1],
    stand_ins=("kept-statement:token-hash",),
)


def _token_active(key_hash: str) -> ApiToken | None:
    """The unrevoked token whose key hashes to `key_hash`, its user with it, or None (one statement)."""
    found = _TOKEN_ACTIVE.rows(key_hash, using=ApiToken.objects.db)
    return found[0] if found else None


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
