from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs import children, extensions

        # Child jobs are the core's own, registered the way the feature apps register theirs.
        extensions.context_method("spawn")(children.spawn)
        extensions.context_method("map")(children.map_children)
        extensions.context_method("gather")(children.gather)
        # Every app's `kinds` module registers its job kinds (like admin.autodiscover).
        autodiscover_modules("kinds")
