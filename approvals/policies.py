"""What happens when a question's deadline passes: `ctx.ask(..., timeout=..., on_timeout=...)`.

    from approvals.policies import Cancel, Default, Escalate, Fail

    ctx.ask("approve", "Ship it?", schema=approval(), timeout=3600, on_timeout=Default({"approved": False,
            "reason": "nobody answered within an hour"}))
    ctx.ask("approve", "Ship it?", timeout=timedelta(hours=4),
            on_timeout=Escalate(to="group:managers", timeout=3600, on_timeout=Fail()))

Beat (`approvals.enforce_deadlines`, every APPROVALS_DEADLINE_INTERVAL seconds) applies the policy
within one interval of the deadline and records it in the decision ledger as the system's.
A policy is stored with the question as JSON (`policy_to_json`), so every process reads the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any


def seconds_of(timeout: float | int | timedelta | None) -> float | None:
    """`timeout` (seconds or a timedelta) as seconds; None stays None. Refuses zero or less."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if seconds <= 0:
        raise ValueError(f"a timeout must be positive, not {timeout!r}")
    return seconds


@dataclass(frozen=True)
class Default:
    """Answer the question with `answer` (checked against its schema when asked); the job resumes
    exactly as after a person's answer."""

    answer: Any


@dataclass(frozen=True)
class Fail:
    """Fail the job with the error code `question_expired` (the default policy)."""


@dataclass(frozen=True)
class Cancel:
    """Cancel the job (and its other open questions)."""


@dataclass(frozen=True)
class Escalate:
    """Reassign the question to `to` (a username, `"group:name"`, or a list of them) with a new
    deadline `timeout` (None: no deadline); when that passes too, apply `on_timeout`
    (default: Fail)."""

    to: str | list[str]
    timeout: float | int | timedelta | None = None
    on_timeout: Default | Fail | Cancel | Escalate | None = None


Policy = Default | Fail | Cancel | Escalate
ACTIONS = ("default", "fail", "cancel", "escalate")


def policy_from(value: Policy | str | None) -> Policy:
    """A policy object from what a job author wrote: an object, `"fail"`, `"cancel"`, or None (Fail)."""
    if value is None:
        return Fail()
    if isinstance(value, Default | Fail | Cancel | Escalate):
        return value
    if value == "fail":
        return Fail()
    if value == "cancel":
        return Cancel()
    raise ValueError(f"on_timeout must be Default(answer), Fail(), Cancel() or Escalate(...), not {value!r}")


def assignee_list(to: str | list[str] | tuple[str, ...]) -> list[str]:
    """`"alice"` or `["alice", "group:ops"]` as a list of non-empty names."""
    names = [to] if isinstance(to, str) else list(to)
    if not names or not all(isinstance(name, str) and name.strip() for name in names):
        raise ValueError(f"assignees must be usernames or 'group:name' strings, not {to!r}")
    return [name.strip() for name in names]


def policy_to_json(policy: Policy) -> dict[str, Any]:
    """The JSON stored on the question (`Question.on_timeout`)."""
    if isinstance(policy, Default):
        return {"action": "default", "answer": policy.answer}
    if isinstance(policy, Cancel):
        return {"action": "cancel"}
    if isinstance(policy, Escalate):
        return {
            "action": "escalate",
            "to": assignee_list(policy.to),
            "timeout": seconds_of(policy.timeout),
            "then": policy_to_json(policy_from(policy.on_timeout)),
        }
    return {"action": "fail"}


def policy_describe(data: dict[str, Any] | None) -> str:
    """The stored policy in words, for the admin and e-mails."""
    data = data or {"action": "fail"}
    action = data.get("action")
    if action == "default":
        return f"answer with the default {data.get('answer')!r}"
    if action == "cancel":
        return "cancel the job"
    if action == "escalate":
        within = f" for {data['timeout']:g} s" if data.get("timeout") else ""
        then = f", then {policy_describe(data.get('then'))}" if data.get("timeout") else ""
        return f"escalate to {', '.join(data.get('to') or [])}{within}{then}"
    return "fail the job"
