"""Write one backup archive of the installation (console/backup.py): the database, the stored
objects, the Label Studio it runs and the keys, with a manifest of sha256s."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from console.backup import BackupError, backup_create, backups_prune


class Command(BaseCommand):
    help = "Back up the platform into one archive (consistent while it runs)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--output",
            default=settings.BACKUP_DIR or None,
            help="directory of the archives (default BACKUP_DIR)",
        )
        parser.add_argument(
            "--keep", type=int, default=0, help="keep this many newest archives there (0: all)"
        )

    def handle(self, *args, output: str | None, keep: int, **options) -> None:
        if not output:
            raise CommandError("say where: --output DIR, or set BACKUP_DIR")
        try:
            archive = backup_create(Path(output))
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        if keep:
            backups_prune(Path(output), keep)
        self.stdout.write(str(archive))
