"""``python -m tests.cluster._older_wire_agent agent ...``: drover's agent, where the server
named in ``DROVER_TEST_OLDER_WIRE`` speaks raft as the releases before the GCM seal did
(server/raft/seal.py): its session keys offer nothing, it seals every frame with Fernet,
and it knows no GCM key, so it can not open a GCM frame. Every other agent is unchanged.
For tests/cluster/test_raft_seal.py: a rolling upgrade mixes the two."""

from __future__ import annotations

import os
import sys

import pysyncobj.encryptor
import pysyncobj.syncobj
from pysyncobj.tcp_connection import TcpConnection

from drover.cli import main
from drover.server.raft import patches

OLDER_WIRE_ENV = "DROVER_TEST_OLDER_WIRE"
_PYSYNCOBJ_SEND = TcpConnection.send
_install_frame_guard = patches.install_frame_guard


def _install_older_wire(limit: int) -> None:
    _install_frame_guard(limit)
    TcpConnection.send = _PYSYNCOBJ_SEND
    if isinstance(TcpConnection.__dict__.get("recvRandKey"), property):
        del TcpConnection.recvRandKey
    pysyncobj.syncobj.getEncryptor = pysyncobj.encryptor.getEncryptor


def _node_name(argv: list[str]) -> str:
    return argv[argv.index("-node-name") + 1] if "-node-name" in argv else ""


if __name__ == "__main__":
    if _node_name(sys.argv) in os.environ.get(OLDER_WIRE_ENV, "").split(","):
        patches.install_frame_guard = _install_older_wire
    raise SystemExit(main())
