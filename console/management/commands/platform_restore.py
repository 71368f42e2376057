"""Restore a backup archive (console/backup.py) into this empty installation; run
``manage.py migrate`` after it."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from console.backup import BackupError, backup_restore


class Command(BaseCommand):
    help = "Restore a platform backup into an empty installation (then run migrate)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("archive")

    def handle(self, *args, archive: str, **options) -> None:
        try:
            manifest = backup_restore(Path(archive))
        except (BackupError, OSError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"restored the backup of {manifest['created_at']} ({len(manifest['files'])} files); "
            "now run: manage.py migrate"
        )
