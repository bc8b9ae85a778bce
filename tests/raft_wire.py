"""What an attacker sends to a raft port, shared by the frame guard's unit tests
(tests/unit/test_raft_frames.py) and the real-process attacks
(tests/cluster/test_raft_security.py)."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

__all__ = ["MakeDir", "frame"]


class MakeDir:
    """Unpickled, it creates ``path``: proof that a frame's pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.path,))


def frame(body: bytes) -> bytes:
    """pysyncobj's framing: a native 4-byte length, then the body."""
    return struct.pack("i", len(body)) + body
