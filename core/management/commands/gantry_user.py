"""Create or update a user with a role; used by `make run` for the admin user."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.roles import OPERATORS, RESEARCHERS, roles_sync


class Command(BaseCommand):
    help = (
        "Create or update a user with the operator or researcher role. The password comes "
        "from --password-file (created with a random password if missing) or "
        "GANTRY_ADMIN_PASSWORD."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        role = parser.add_mutually_exclusive_group()
        role.add_argument("--operator", action="store_true")
        role.add_argument("--researcher", action="store_true")
        parser.add_argument("--superuser", action="store_true")
        parser.add_argument("--password-file", type=Path)

    def _password(self, password_file: Path | None) -> str | None:
        from_env = os.environ.get("GANTRY_ADMIN_PASSWORD")
        if from_env:
            return from_env
        if password_file is None:
            return None
        if password_file.exists():
            value = password_file.read_text().strip()
            if not value:
                raise CommandError(f"{password_file} is empty; delete it to get a new password.")
            return value
        password_file.parent.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(12)
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(value + "\n")
        return value

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(username=username)
        password = self._password(options["password_file"])
        if password:
            user.set_password(password)
        elif created:
            user.set_unusable_password()
        if options["superuser"]:
            user.is_superuser = True
            user.is_staff = True
        if options["operator"]:
            user.is_staff = True
        user.save()
        if Group.objects.filter(name__in=[OPERATORS, RESEARCHERS]).count() != 2:
            roles_sync()
        if options["operator"]:
            user.groups.add(Group.objects.get(name=OPERATORS))
        if options["researcher"]:
            user.groups.add(Group.objects.get(name=RESEARCHERS))
        verb = "created" if created else "updated"
        self.stdout.write(f"user {username} {verb}")
