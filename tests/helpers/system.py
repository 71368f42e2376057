"""The machine the suite runs on: the repository's root, and a disk a test can fill up."""

from __future__ import annotations

import errno
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def spare_redis_url(k: int = 0) -> str:
    """The ``k``-th database of the suite's Redis that no process of the suite uses: a test's
    own processes there find only their own tasks (another database, another virtual host).
    Each process of the suite (tests/settings.py) has its own spares."""
    from django.conf import settings

    index = int(os.environ.get("PLATFORM_TEST_PROCESS", "gw0").removeprefix("gw"))
    return settings.REDIS_URL.rsplit("/", 1)[0] + f"/{15 - k - 2 * index}"


class SmallDisk:
    """A tmpfs of a few megabytes mounted for one test: a disk that can be filled up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self) -> None:
        """Write until the disk is full (ENOSPC), leaving no free block."""
        with open(self.ballast, "ab") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        # Smaller writes may still fit in the last partial block: fill it byte by byte.
        with open(self.ballast, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 512)
            except OSError:
                pass

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)
