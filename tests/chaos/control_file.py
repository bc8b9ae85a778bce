"""The control files through which the chaos runner steers test-only hooks inside server
processes (the raft partition of tests/chaos/partition.py, the shrunk node of
tests/chaos/disagreement.py): the runner writes a small JSON document atomically, and the
hook in each server polls the file's modification time and swaps in the new value.

A file, not an RPC: the hooks live below the API (pysyncobj's transport, the plan
applier's view), and every server must see the same value without the runner knowing
which of them leads.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

__all__ = ["POLL_S", "WatchedFile", "write_control"]

POLL_S: Final = 0.02

T = TypeVar("T")


def write_control(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path``'s content at once: a reader sees the old or the new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


class WatchedFile(Generic[T]):
    """The hook's side: ``value`` is ``parse`` of the file's newest readable content (kept
    fresh by a daemon thread); ``initial`` until the file first parses."""

    def __init__(self, path: str, parse: Callable[[dict[str, Any]], T], initial: T, name: str) -> None:
        self._path = path
        self._parse = parse
        self._mtime = -1
        self.value: T = initial
        self._stop = threading.Event()
        self._reload()
        threading.Thread(target=self._poll, name=name, daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    def _reload(self) -> None:
        try:
            mtime = os.stat(self._path).st_mtime_ns
            if mtime == self._mtime:
                return
            data = json.loads(Path(self._path).read_text())
        except (OSError, ValueError):
            return  # being replaced, or not there yet: keep the last value
        self._mtime = mtime
        self.value = self._parse(data)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            self._reload()
