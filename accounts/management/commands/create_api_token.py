from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.services import api_token_create, user_ensure


class Command(BaseCommand):
    help = "Print a new API token for USERNAME on the last line of output."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--create", action="store_true", help="create the user if missing")
        parser.add_argument("--reviewer", action="store_true", help="add the user to the 'reviewers' group")
        parser.add_argument("--name", default="", help="a label for the token")

    def handle(self, username, create, reviewer, name, **options):
        User = get_user_model()
        if not create and not User.objects.filter(username=username).exists():
            raise CommandError(f"no user {username!r}; pass --create to make one")
        user, created = user_ensure(username=username, reviewer=reviewer)
        if created:
            self.stdout.write(f"created user {username}")
        if reviewer:
            self.stdout.write(f"{username} is in the 'reviewers' group")
        _, key = api_token_create(user=user, name=name)
        self.stdout.write(key)
