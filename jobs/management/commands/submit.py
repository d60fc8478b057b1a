import json

from django.core.management.base import BaseCommand, CommandError

from jobs.errors import PlatformError
from jobs.services import jobs_submit_many


class Command(BaseCommand):
    help = "Submit jobs of KIND as an operator would; print their ids, one a line."
    # Django's system checks load every URLconf and app check before the first job: about a
    # quarter of a second per submit, for checks the web server and the workers run anyway.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("kind")
        parser.add_argument("--input", default="{}", help="the job's input as JSON (default {})")
        parser.add_argument("--count", type=int, default=1, help="how many jobs to submit (default 1)")

    def handle(self, kind, input, count, **options):
        try:
            payload = json.loads(input)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--input is not JSON: {exc}") from exc
        if count < 1:
            raise CommandError("--count must be at least 1")
        batch = 500
        try:
            for start in range(0, count, batch):
                # One transaction per batch; every job is dispatched when its batch commits.
                jobs = jobs_submit_many(kind=kind, inputs=[payload] * min(batch, count - start))
                self.stdout.write("\n".join(str(job.pk) for job in jobs))
        except PlatformError as exc:
            raise CommandError(exc.message) from exc
