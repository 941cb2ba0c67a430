"""``manage.py demo_user``: create (or reset) the user who logs in to the toggle page and the admin."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from demo_project.toggles.models import Profile


class Command(BaseCommand):
    help = (
        "Create the demo user (demo / demo by default) with a profile, as a superuser so that the admin "
        "shows the request log. Run it again to reset the password; nothing else is changed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="demo", help="Username (demo).")
        parser.add_argument("--password", default="demo", help="Password (demo). This is a local demo only.")
        parser.add_argument(
            "--no-superuser",
            dest="superuser",
            action="store_false",
            help="Create a plain user: the toggle page only, no admin.",
        )
        parser.add_argument(
            "--keep-existing", action="store_true", help="Leave the user alone if it exists already (make serve)."
        )

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        username, password = options["username"], options["password"]
        user, created = user_model.objects.get_or_create(**{user_model.USERNAME_FIELD: username})
        if not created and options["keep_existing"]:
            Profile.for_user(user)
            self.stdout.write(f"User {username!r} exists; left as it is.")
            return
        user.set_password(password)
        user.is_staff = user.is_superuser = options["superuser"]
        user.save()
        profile = Profile.for_user(user)
        kind = "superuser" if options["superuser"] else "user"
        verb = "Created" if created else "Updated"
        self.stdout.write(
            f"{verb} {kind} {username!r} (password {password!r}) with profile {profile.pk}. "
            "Run `make serve` and log in at http://127.0.0.1:8000/"
        )
