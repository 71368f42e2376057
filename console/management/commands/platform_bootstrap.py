"""Create the first administrator and team on an empty platform, and print how to log in.

The login comes from PLATFORM_ADMIN_USERNAME / PLATFORM_ADMIN_PASSWORD when set; otherwise the
user is ``admin`` with a generated password, kept (mode 0600) in the data directory's
``initial_admin_password`` so that the next ``make run`` can print it again.
"""

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from console.models import Membership
from console.services import audit_record, team_create


class Command(BaseCommand):
    help = "Create the first administrator and team when the platform has none."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="console URL to print")

    def handle(self, *args, url: str, **options) -> None:
        User = get_user_model()
        password_file = settings.DATA_DIR / "initial_admin_password"
        username = os.environ.get("PLATFORM_ADMIN_USERNAME", "admin")
        password = os.environ.get("PLATFORM_ADMIN_PASSWORD", "")
        first_admin = User.objects.filter(is_superuser=True).order_by("pk").first()
        if first_admin is None:
            if not password:
                password = secrets.token_urlsafe(12)
                settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
                password_file.touch(mode=0o600)
                password_file.write_text(password + "\n")
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
        else:
            username = first_admin.get_username()
            if not password and password_file.exists():
                password = password_file.read_text().strip()
        shown = password or "(the password you set; PLATFORM_ADMIN_PASSWORD)"
        self.stdout.write(f"\n  控制台 Console : {url}\n  登录 Login     : {username} / {shown}\n")
