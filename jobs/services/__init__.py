"""Every write to a job goes through here.

- `transitions`: `job_transition`, the only function that changes `Job.status` (and runs the
  feature apps' transition hooks in its transaction), and `job_dispatch`
- `moves`: the named moves built on it: claim, hand back, complete, fail or retry, suspend,
  resume, wake, cancel, retry by hand
- `submitting`: submit one job (idempotency keys) or many in one transaction
- `reconciling`: beat's passes: lost dispatches, expired leases, cancelled runs past their grace,
  the tables' statistics while they grow
"""

from jobs.services.moves import (
    job_cancel,
    job_claim,
    job_complete,
    job_fail,
    job_fail_suspended,
    job_hand_back,
    job_lock,
    job_resume,
    job_retry,
    job_suspend,
    job_wake,
    retry_delay,
    run_lease_release,
    run_lock,
)
from jobs.services.reconciling import (
    job_run_died,
    jobs_recover_expired_leases,
    jobs_redispatch_stale,
    jobs_statistics_refresh,
    jobs_terminate_cancelled_runs,
)
from jobs.services.submitting import attempt_budget, job_submit, jobs_submit_many, request_digest
from jobs.services.transitions import job_dispatch, job_transition

__all__ = [
    "attempt_budget",
    "job_cancel",
    "job_claim",
    "job_complete",
    "job_dispatch",
    "job_fail",
    "job_fail_suspended",
    "job_hand_back",
    "job_lock",
    "job_resume",
    "job_retry",
    "job_run_died",
    "job_submit",
    "job_suspend",
    "job_transition",
    "job_wake",
    "jobs_recover_expired_leases",
    "jobs_redispatch_stale",
    "jobs_statistics_refresh",
    "jobs_submit_many",
    "jobs_terminate_cancelled_runs",
    "request_digest",
    "retry_delay",
    "run_lease_release",
    "run_lock",
]
