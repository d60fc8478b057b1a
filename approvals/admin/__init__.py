"""The approvals app in the admin: the reviewers' inbox (questions) and the decision ledger."""

from approvals.admin.decisions import DecisionAdmin, JobDecisionInline
from approvals.admin.questions import QuestionAdmin

__all__ = ["DecisionAdmin", "JobDecisionInline", "QuestionAdmin"]
