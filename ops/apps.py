from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Operations: metrics, readiness, the staff dashboard, the periodic passes' scheduler."""

    name = "ops"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The worker's receivers (logging, heartbeats) connect on import;
        # a request's job log context ends when its response is closed.
        from django.core.signals import request_finished

        from ops import signals  # noqa: F401
        from ops.middleware import job_log_context_end

        request_finished.connect(job_log_context_end, dispatch_uid="ops.job_log_context_end")

        from jobs.extensions import job_admin_link
        from ops.flower import job_flower_links

        job_admin_link("ops.flower")(job_flower_links)

        # Each run of a periodic pass is recorded for /readyz, /metrics and the dashboard.
        from jobs.extensions import pass_observer
        from ops.scheduler import periodic_pass_record

        pass_observer("ops.periodic_pass_record")(periodic_pass_record)

        # Each run of a job: its log context, and the worker's last job for /readyz.
        from jobs.extensions import run_observer
        from ops.signals import job_run_observe

        run_observer("ops.job_run_observe")(job_run_observe)
