"""One coordinator per data directory, enforced with an OS file lock.

Two coordinators on one SQLite file each run their own supervisor: both read "queued" and
both launch, which breaks the job state machine across processes (the in-process write lock
cannot see the other process). ``flock`` on ``<data_dir>/coordinator.lock`` is held for the
life of the app and released by the kernel when the process dies, so a kill -9 never leaves
a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DataDirInUse(RuntimeError):
    """Another live coordinator holds this data directory."""


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "coordinator.lock"
        self._fd: int | None = None

    def acquire(self) -> "DataDirLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DataDirInUse(
                f"data dir {self.path.parent} is in use by another coordinator (pid {holder}); "
                "stop it first or give this one its own GRADWIRE_DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self) -> None:  # an app that was built but never served
        self.release()
