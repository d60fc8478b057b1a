"""Checking a stored answer again when the job is about to use it.

An answer is not trusted just because it is stored. Each time `ctx.ask` is about to return one
(the job resumed after the answer, ran again after a crash, or was retried by hand), it holds
only if:

- every reviewer whose approving vote counts is still active and still allowed to answer: the
  `approvals.answer_question` permission, one of the assignees (those the job's code names now,
  or those the question is assigned to now, after an escalation), and not the job's submitter
  unless its kind allows self-approval (`reviewer_no_longer_allowed`);
- the question's policy (assignees as written, quorum, deadline and its policy) has the digest
  the answer was given under (`policy_changed`);
- the answer (each approving vote, for an approval) is younger than the `valid_for` the code
  asks with now (`approval_stale`).

When one fails, `approvals.services.asking.question_ask_again` opens a new round. Ages are
measured with the database's clock, as the answers' times were written by other processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import Group
from django.db.models import Q

from approvals.models import Decision, Question
from approvals.schemas import QuestionType
from approvals.selectors import ANSWER_PERMISSION, kinds_allowing_self_approval
from approvals.services.asking import vote_time
from jobs.clock import database_now

REVIEWER_NO_LONGER_ALLOWED = "reviewer_no_longer_allowed"
POLICY_CHANGED = "policy_changed"
APPROVAL_STALE = "approval_stale"


@dataclass
class Recheck:
    """The outcome of `answer_recheck`: why the answer may not be used (`reasons`, most
    important first; none: it holds), the votes dropped and why, and the votes still valid
    (oldest first)."""

    reasons: list[str] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    carried: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.reasons

    @property
    def because(self) -> str:
        return self.reasons[0] if self.reasons else ""

    @property
    def text(self) -> str:
        """Why, in words, for the ledger and the inbox."""
        return "; ".join(self.notes)

    def fail(self, reason: str, note: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)
        self.notes.append(note)


def answer_recheck(
    *, question: Question, policy_digest: str, assignees: dict[str, list[int]], valid_for: float | None,
) -> Recheck:
    """Check the stored answer of `question` against the rule the job's code asks with now:
    `policy_digest` and the resolved `assignees` (`question_spec_build`) and `valid_for`
    (seconds, or None). Reads only; see the module's docstring for the rule."""
    verdict = Recheck()
    policy_changed = bool(question.policy_digest) and question.policy_digest != policy_digest
    if policy_changed:
        verdict.fail(POLICY_CHANGED, "the job's code now asks it with other assignees, quorum or deadline")
    now = database_now()
    votes = list(
        question.decisions.filter(round=question.round, kind=Decision.Kind.APPROVED).select_related("actor")
    )
    votes.sort(key=lambda vote: (vote_time(vote), vote.pk))
    approving = question.type == QuestionType.APPROVAL and isinstance(question.answer, dict) \
        and question.answer.get("approved") is True and votes
    if not approving:
        # A rejection, another type's answer or the system's default: only its age counts.
        if valid_for is not None and question.answered_at is not None:
            age = (now - question.answered_at).total_seconds()
            if age > valid_for:
                verdict.fail(APPROVAL_STALE, f"the answer was {_duration(age)} old when the job used it "
                                             f"(valid_for {_duration(valid_for)})")
        return verdict
    self_approval = question.job.kind in kinds_allowing_self_approval()
    for vote in votes:
        reviewer = vote.actor
        why = None if reviewer is None else _reviewer_refusal(
            reviewer, question=question, assignees=assignees, self_approval=self_approval,
            also_current=not policy_changed,
        )
        if why is not None:
            verdict.dropped.append({"reviewer": vote.actor_name, "why": why})
            verdict.fail(REVIEWER_NO_LONGER_ALLOWED, f"the approval of {vote.actor_name} no longer counts: {why}")
            continue
        age = (now - vote_time(vote)).total_seconds()
        if valid_for is not None and age > valid_for:
            verdict.dropped.append({"reviewer": vote.actor_name, "why": "stale"})
            verdict.fail(APPROVAL_STALE, f"the approval of {vote.actor_name} was {_duration(age)} old when the "
                                         f"job used it (valid_for {_duration(valid_for)})")
            continue
        verdict.carried.append(vote)
    verdict.reasons.sort(key=[POLICY_CHANGED, REVIEWER_NO_LONGER_ALLOWED, APPROVAL_STALE].index)
    return verdict


def _reviewer_refusal(
    reviewer: Any, *, question: Question, assignees: dict[str, list[int]], self_approval: bool, also_current: bool,
) -> str | None:
    """Why `reviewer` (fresh from the database) may no longer answer `question`, or None. The
    assignees are those the code names now (`assignees`, resolved) and, while the policy is
    unchanged, those the question is assigned to now (an escalation adds people; it does not
    take back the votes given before it)."""
    name = reviewer.get_username()
    if not reviewer.is_active:
        return f"{name} was deactivated"
    if not reviewer.has_perm(ANSWER_PERMISSION):
        return f"{name} no longer holds the {ANSWER_PERMISSION!r} permission"
    job = question.job
    if job.owner_id is not None and job.owner_id == reviewer.pk and not self_approval:
        return f"{name} submitted the job, and its kind does not allow self-approval"
    if reviewer.is_superuser:
        return None
    if reviewer.pk in (assignees.get("users") or []):
        return None
    if Group.objects.filter(pk__in=assignees.get("groups") or [], user=reviewer).exists():
        return None
    if also_current and Question.objects.filter(pk=question.pk).filter(
        Q(assigned_users=reviewer) | Q(assigned_groups__user=reviewer)
    ).exists():
        return None
    return f"{name} is no longer one of the assignees (left the group, or was removed from the question)"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
