import json
from collections.abc import Iterator

from django.core.management.base import BaseCommand, CommandError

from jobs.errors import PlatformError
from jobs.services import jobs_submit_many


class Command(BaseCommand):
    help = "Submit jobs of KIND as an operator would; print their ids, one a line."
    # Django's system checks load every URLconf and app check before the first job: about a
    # quarter of a second per submit, for checks the web server and the workers run anyway.
    requires_system_checks: list[str] = []
    # Jobs written and dispatched in one transaction. The first batch is small, so that the workers
    # start on it while the rest are written (a batch of 500 takes about 0.15 s here).
    first_batch = 50
    batch = 500

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
        try:
            for size in self.batches(count):
                # One transaction per batch; every job is dispatched when its batch commits.
                jobs = jobs_submit_many(kind=kind, inputs=[payload] * size)
                self.stdout.write("\n".join(str(job.pk) for job in jobs))
        except PlatformError as exc:
            raise CommandError(exc.message) from exc

    def batches(self, count: int) -> Iterator[int]:
        """The sizes of the batches that submit `count` jobs: `first_batch`, then `batch` each."""
        size = self.first_batch
        while count > 0:
            yield min(size, count)
            count -= size
            size = self.batch
