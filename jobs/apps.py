from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts.credentials import credential_revoked
        from jobs import children, extensions, streams

        # Child jobs are the core's own, registered the way the feature apps register theirs.
        extensions.context_method("spawn")(children.spawn)
        extensions.context_method("map")(children.map_children)
        extensions.context_method("gather")(children.gather)
        # A revoked API token closes the live streams opened with it, in every web process.
        credential_revoked.connect(streams.credential_revoked_publish, dispatch_uid="jobs.streams.revoked")
        # Every app's `kinds` module registers its job kinds (like admin.autodiscover).
        autodiscover_modules("kinds")
