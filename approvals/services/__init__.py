"""Every write to a question goes through here; the admin, its bulk actions, the API, the job
page and beat call the same functions.

- `asking`: what `ctx.ask` checks, opening and re-opening questions, cancelling them with a job
- `answering`: the one permission check and the one answer service (votes, quorum, resume)
- `rechecking`: a stored answer checked again when the job is about to use it
- `deadlines`: the `on_timeout` policies beat applies
- `ledger`: the append-only decision ledger
- `notifications`: e-mails and webhooks when a question opens or is escalated
"""

from approvals.errors import (
    AlreadyAnswered,
    AlreadyVoted,
    InvalidAnswer,
    NotAllowedToAnswer,
    QuestionClosed,
    QuestionExpired,
    QuestionNotFound,
)
from approvals.services.answering import (
    answer_validate,
    question_answer,
    question_check_can_answer,
    question_settle,
)
from approvals.services.asking import (
    assignees_resolve,
    question_ask_again,
    question_assign,
    question_open,
    question_policy_digest,
    question_spec_build,
    questions_cancel_for_job,
)
from approvals.services.deadlines import question_expire, questions_expire_due
from approvals.services.ledger import decision_record, request_client_address
from approvals.services.notifications import question_announce, question_link, question_notify

__all__ = [
    "AlreadyAnswered",
    "AlreadyVoted",
    "InvalidAnswer",
    "NotAllowedToAnswer",
    "QuestionClosed",
    "QuestionExpired",
    "QuestionNotFound",
    "answer_validate",
    "assignees_resolve",
    "decision_record",
    "question_announce",
    "question_answer",
    "question_ask_again",
    "question_assign",
    "question_check_can_answer",
    "question_expire",
    "question_link",
    "question_notify",
    "question_open",
    "question_policy_digest",
    "question_settle",
    "question_spec_build",
    "questions_cancel_for_job",
    "questions_expire_due",
    "request_client_address",
]
