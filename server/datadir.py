"""Exclusive use of a server's data dir: the running server holds a lock on it.

Offline tools (`drover operator raft logs|state`) read the raft journal and snapshot of a
stopped server; they take the same lock without waiting and refuse while a server holds it,
so they never read files a live server is writing.

A data dir holds the raft journal and snapshots: the whole state, node secrets' hashes
included, and a journal pysyncobj unpickles when it starts. So it is the owner's alone:
0700, its files 0600 (``private_dir``, ``open_private``; the server agent also sets
its umask to 0077 so the files pysyncobj writes get the same mode).
"""

from __future__ import annotations

import fcntl
import os
from typing import Final, TextIO

LOCK_FILE: Final = "LOCK"
PRIVATE_DIR_MODE: Final = 0o700
PRIVATE_FILE_MODE: Final = 0o600
# What the server agent's files get whoever creates them (pysyncobj's journal and meta).
PRIVATE_UMASK: Final = 0o077


def private_dir(path: str) -> str:
    """Create ``path`` (and missing parents) and make it the owner's alone: 0700 whatever
    the umask, and an existing directory is narrowed too. Parents it finds are left as they
    are (``/var/lib`` is not ours)."""
    os.makedirs(path, mode=PRIVATE_DIR_MODE, exist_ok=True)
    os.chmod(path, PRIVATE_DIR_MODE)
    return path


def narrow_files(path: str) -> None:
    """Make every regular file directly in ``path`` 0600: for files another library created
    with the process's umask (pysyncobj's journal)."""
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                os.chmod(entry.path, PRIVATE_FILE_MODE)


def open_private(path: str, flags: int) -> int:
    """``os.open`` for a file only its owner may read or write: created 0600, and an
    existing file narrowed to 0600 before anything is written to it."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


class DataDirBusyError(Exception):
    """Another process (a running server) holds the data dir."""


class DataDirLock:
    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._file: TextIO | None = None

    def acquire(self) -> None:
        private_dir(os.path.dirname(self.path))
        # Held until release().
        handle = os.fdopen(open_private(self.path, os.O_RDWR | os.O_APPEND), "a+", encoding="utf-8")
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
