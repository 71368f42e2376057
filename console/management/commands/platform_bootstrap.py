"""Create the first administrator and team on an empty platform, and print how to log in.

The login comes from PLATFORM_ADMIN_USERNAME / PLATFORM_ADMIN_PASSWORD when set; otherwise the
user is ``admin`` with a generated password. A generated password is printed once, when the
account is created, and written (mode 0600) to the data directory's ``initial_admin_password``;
later starts print where it is (or how to set a new one), never the password itself: a start's
output goes to terminals, logs and journals that others read.
"""

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from console.models import Membership
from console.services import audit_record, team_create
from runtime.env import env_str


class Command(BaseCommand):
    help = "Create the first administrator and team when the platform has none."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="console URL to print")

    def handle(self, *args, url: str, **options) -> None:
        User = get_user_model()
        password_file = settings.DATA_DIR / "initial_admin_password"
        username = env_str("PLATFORM_ADMIN_USERNAME", "admin")
        password = env_str("PLATFORM_ADMIN_PASSWORD")
        first_admin = User.objects.filter(is_superuser=True).order_by("pk").first()
        if first_admin is None:
            generated = not password
            if generated:
                password = secrets.token_urlsafe(12)
                settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
                # Created 0600 (or made so): the file may be left from an earlier database.
                fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.fchmod(fd, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(password + "\n")
            with transaction.atomic():
                admin, _created = User.objects.get_or_create(username=username)
                # An existing account of that name becomes the administrator.
                admin.is_staff = admin.is_superuser = admin.is_active = True
                admin.set_password(password)
                admin.save()
                audit_record(
                    action="user.create",
                    actor=None,
                    target=admin,
                    actor_username="platform_bootstrap",
                    data={"is_staff": True},
                )
                if not Membership.objects.filter(user=admin).exists():
                    team_create(actor=admin, name="默认团队")
            shown = password if generated else "(PLATFORM_ADMIN_PASSWORD)"
        else:
            username = first_admin.get_username()
            if password_file.exists():
                shown = f"(the initial password is in {password_file})"
            else:
                shown = "(the password you set)"
            shown += f"; a new one: python manage.py changepassword {username}"
        self.stdout.write(f"\n  控制台 Console : {url}\n  登录 Login     : {username} / {shown}\n")
