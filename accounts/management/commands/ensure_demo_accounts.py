from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from accounts.services import user_ensure


class Command(BaseCommand):
    help = "Create the demo accounts admin/admin and reviewer/reviewer if absent (never in production)."

    def handle(self, **options):
        if not settings.DEBUG:
            raise CommandError("demo accounts are for development only (DJANGO_DEBUG is off)")
        _, admin_created = user_ensure(username="admin", password="admin", superuser=True)
        reviewer, reviewer_created = user_ensure(username="reviewer", password="reviewer", staff=True, reviewer=True)
        if not reviewer.email:
            # Questions e-mail their assignees; under `make run` the console backend prints them.
            reviewer.email = "reviewer@localhost"
            reviewer.save(update_fields=["email"])
        for name, created in (("admin", admin_created), ("reviewer", reviewer_created)):
            if created:
                self.stdout.write(self.style.WARNING(
                    f"*** DEMO ACCOUNT CREATED: {name} / {name} — for local use only; change or delete it ***"))
