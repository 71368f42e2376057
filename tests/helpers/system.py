"""The machine the suite runs on: the repository's root, and a disk a test can fill up."""

from __future__ import annotations

import errno
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


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
