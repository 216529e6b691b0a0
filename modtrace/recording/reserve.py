"""A SQLite database on a full disk cannot even record that it is full: the
recorder keeps a small reserve file beside it and gives the space back when
a write fails, so the run can still be marked failed."""

from __future__ import annotations

import os
from pathlib import Path

from modtrace.store.runs import _pid_alive

RESERVE_BYTES = 512 * 1024


class DiskReserve:
    """The reserve file beside the database at ``db_path`` (None: not a file, no reserve)."""

    def __init__(self, db_path: Path | None) -> None:
        self.path = None if db_path is None else db_path.with_name(f"{db_path.name}-reserve-{os.getpid()}")

    def take(self) -> None:
        """Create the reserve, removing those left by processes that are gone."""
        path = self.path
        if path is None:
            return
        stem = path.name.rsplit("-", 1)[0]
        for stale in path.parent.glob(f"{stem}-*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                stale.unlink(missing_ok=True)
        fallocate = getattr(os, "posix_fallocate", None)  # not on macOS or Windows
        try:
            with open(path, "wb") as fh:
                if fallocate is not None:
                    fallocate(fh.fileno(), 0, RESERVE_BYTES)
                else:
                    fh.write(bytes(RESERVE_BYTES))
        except OSError:
            path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
