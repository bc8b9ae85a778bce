"""Exclusive use of a server's data dir: the running server holds a lock on it.

Offline tools (`drover operator raft logs|state`) read the raft journal and snapshot of a
stopped server; they take the same lock without waiting and refuse while a server holds it,
so they never read files a live server is writing.
"""

from __future__ import annotations

import fcntl
import os
from typing import Final, TextIO

LOCK_FILE: Final = "LOCK"


class DataDirBusyError(Exception):
    """Another process (a running server) holds the data dir."""


class DataDirLock:
    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._file: TextIO | None = None

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise DataDirBusyError(
                f"data dir {os.path.dirname(self.path)} is in use by a running server (pid {holder}); stop it first"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
