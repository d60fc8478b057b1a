"""The errors a reviewer (or an integration answering for one) can cause: a family of
`jobs.errors.PlatformError`, the root that every app's errors share, mapped to HTTP once (in
`jobs.api_errors`) and shown as admin messages."""

from __future__ import annotations

from jobs.errors import PlatformError


class QuestionNotFound(PlatformError):
    code = "not_found"
    http_status = 404


class InvalidAnswer(PlatformError):
    code = "invalid_answer"


class AlreadyAnswered(PlatformError):
    code = "already_answered"
    http_status = 409


class AlreadyVoted(PlatformError):
    """The reviewer already approved this quorum question; other reviewers must approve too."""

    code = "already_voted"
    http_status = 409


class QuestionClosed(PlatformError):
    code = "question_closed"
    http_status = 409


class NotAllowedToAnswer(PlatformError):
    code = "not_allowed"
    http_status = 403


class QuestionExpired(PlatformError):
    """The answer came after the question's deadline (`expires_at`), before beat applied its
    policy: refused, and recorded in the ledger."""

    code = "question_expired"
    http_status = 409
