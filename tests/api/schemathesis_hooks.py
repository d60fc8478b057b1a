"""Schemathesis hooks of the `make test` run (loaded by the `st` process through
SCHEMATHESIS_HOOKS; see tests/api/test_schemathesis.py).

Two operations use their object up: `DELETE /api/webhooks/{id}/` and `POST /api/wake/{token}/`
(a token is good once). Each phase sends them again, so that every call but the first would
meet a 404 and test nothing. Before each such call, the hook makes a fresh object of the same
reviewer and sends the call to it instead: a webhook through the API, a wake token for a parked
job of theirs through the platform's own service (Django, on the test database).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx
import schemathesis


def _fresh_webhook() -> str:
    response = httpx.post(
        f"{os.environ['ST_BASE_URL']}/api/webhooks/",
        json={"url": "https://hooks.example.com/to-delete", "events": ["failed"]},
        headers={"Authorization": f"Token {os.environ['ST_TOKEN']}"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["id"]


_minted = 0


def _fresh_wake_token() -> str:
    global _minted
    import django

    django.setup()  # settings and database of the test run: the environment of this process
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's logging settings say INFO
    from waits.policy import WaitPolicy
    from waits.services import _wait_open, wake_token  # outside any run: not fenced to one

    _minted += 1
    wait = _wait_open(job_id=os.environ["ST_PARKED_JOB"], key=f"again-{_minted}", service="an outside service",
                      policy=WaitPolicy(), person=None)
    return wake_token(wait.token_salt)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    parameters = case.path_parameters or {}
    if case.method.upper() == "DELETE" and parameters.get("id") == os.environ["ST_WEBHOOK_TO_DELETE"]:
        parameters["id"] = _fresh_webhook()
    elif case.operation.path == "/api/wake/{token}/" and parameters.get("token") == os.environ["ST_WAKE_TOKEN"]:
        parameters["token"] = _fresh_wake_token()
