"""`test.wait`: `demo.generate`'s calls to the simulated service, with the policy and injected
faults taken from the input, so the tests can use short marks and script transport failures."""

from __future__ import annotations

import hashlib

from django.core.cache import cache

from demo.kinds import generation_check, generation_submit
from jobs.registry import job_kind
from tests.testkinds.kinds import _policy
from waits.models import Wait
from waits.policy import CheckResult, Person, TransportError, WaitPolicy

POLICY_FIELDS = ("marks", "callback", "min_interval", "max_interval", "max_duration", "max_throttle_bounces",
                 "max_transport_failures", "transport_backoff", "max_executions")


def seen(job_id, what: str) -> list:
    """What the kind recorded for the test (in Redis, the test run's key prefix)."""
    return cache.get(f"waittest:{job_id}:{what}") or []


def _record(job_id, what: str, value) -> None:
    cache.set(f"waittest:{job_id}:{what}", [*seen(job_id, what), value], 3600)


@job_kind("test.wait", input_schema={"type": "object", "required": ["delay"]})
def wait(ctx, input):
    """Generates through the simulated service. `faults`: a script for the check calls, one of
    "fault" (a transport error), "pending" (pretend still running) or "real" (ask the service;
    also once the script runs out). `submit_faults` N: the first N submits reach the service but
    their answer is "lost" (a transport error)."""
    policy = WaitPolicy(**{name: input[name] for name in POLICY_FIELDS if name in input})
    body = {key: input[key] for key in ("delay", "drop_callback", "throttle") if key in input}

    def submit(token: str, callback_url: str | None) -> str:
        _record(ctx.job_id, "tokens", token)
        _record(ctx.job_id, "token_hashes", hashlib.sha256(token.encode()).hexdigest())
        external_id = generation_submit({"prompt": "test", **body}, token, callback_url)
        _record(ctx.job_id, "external_ids", external_id)
        if len(seen(ctx.job_id, "tokens")) <= input.get("submit_faults", 0):
            raise TransportError("the answer to the submit was lost (injected)")
        return external_id

    def check(external_id: str) -> CheckResult:
        calls = seen(ctx.job_id, "checks")
        script = input.get("faults", [])
        step = script[len(calls)] if len(calls) < len(script) else "real"
        _record(ctx.job_id, "checks", step)
        if step == "fault":
            raise TransportError("connection reset (injected)")
        if step == "pending":
            return CheckResult.pending()
        return generation_check(external_id)

    result = ctx.wait_for("generate", submit=submit, check=check, policy=policy, service="simulated generation",
                          **combined(input))
    return {"text": result["text"], "ended_by": Wait.objects.get(job_id=ctx.job_id, key="generate").ended_by}


TEXT = {"type": "object", "properties": {"text": {"type": "string", "minLength": 1}}, "required": ["text"]}


def combined(input: dict) -> dict:
    """`person`, `timeout`, `on_timeout` of `ctx.wait_for` from the input (`person`: true, or
    {"assignees": ...}): a combined wait."""
    if not input.get("person"):
        return {}
    spec = input["person"] if isinstance(input["person"], dict) else {}
    person = Person("The service may have lost this: stand in for it.", schema=spec.get("schema", TEXT),
                    details={"job": "test"}, assignees=spec.get("assignees"))
    return {"person": person, "timeout": input.get("timeout"), "on_timeout": _policy(input.get("on_timeout"))}


def service_finish(job_id, text: str = "done by the service") -> None:
    """Make the pretend service of `test.combined` report the work done."""
    cache.set(f"waittest:{job_id}:finished", text, 3600)


@job_kind("test.combined", input_schema={"type": "object"})
def combined_wait(ctx, input):
    """A combined wait on a pretend service that no HTTP reaches: `submit` records its token,
    `check` answers pending until the test calls `service_finish`. Returns the text and the
    channel that ended the wait."""
    policy = WaitPolicy(**{name: input[name] for name in POLICY_FIELDS if name in input})

    def submit(token: str, callback_url: str | None) -> str:
        _record(ctx.job_id, "tokens", token)
        return f"pretend-{len(seen(ctx.job_id, 'tokens'))}"

    def check(external_id: str) -> CheckResult:
        _record(ctx.job_id, "checks", external_id)
        text = cache.get(f"waittest:{ctx.job_id}:finished")
        return CheckResult.succeeded({"text": text}) if text else CheckResult.pending()

    result = ctx.wait_for("generate", submit=submit, check=check, policy=policy, service="pretend",
                          **combined({"person": True, **input}))
    return {"text": result["text"], "ended_by": Wait.objects.get(job_id=ctx.job_id, key="generate").ended_by}
