"""The raft peer set a server starts with, kept in its data dir across restarts.

A server that joined with ``-join`` has no ``-peers`` to restart with, and one that saw
servers join or leave would restart with a stale ``-peers``: so every change of the
configuration is written here, and at start this file wins over ``-peers``. pysyncobj
replays the membership entries of its journal on top, which brings a server that
stopped in the middle of a change to the same set.

The write is durable before it counts: written to a temporary file, fsync'd, renamed over
the old one, and the directory fsync'd, so a power loss leaves the old set or the new
one, never half of either. ``configured_size`` is the largest number of voters this
server has seen in the configuration: the size autopilot never removes below a quorum of.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

__all__ = ["PEERS_FILE", "PeerSet", "load_peer_set", "save_peer_set"]

PEERS_FILE = "peers.json"


@dataclass(frozen=True, slots=True)
class PeerSet:
    # Every voter's raft address, this server's own included, sorted.
    members: tuple[str, ...]
    configured_size: int


def load_peer_set(raft_dir: str) -> PeerSet | None:
    """The saved peer set, or None if this server never saved one (a first start)."""
    path = os.path.join(raft_dir, PEERS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: can not read the saved raft peer set: {exc}") from exc
    members = data.get("members") if isinstance(data, dict) else None
    if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
        raise ValueError(f"{path}: 'members' must be a list of raft addresses")
    size = data.get("configured_size", len(members))
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{path}: 'configured_size' must be a positive integer")
    return PeerSet(members=tuple(sorted(members)), configured_size=size)


def save_peer_set(raft_dir: str, peer_set: PeerSet) -> None:
    """Replace the saved set with ``peer_set``, durably (see the module docstring)."""
    path = os.path.join(raft_dir, PEERS_FILE)
    tmp = path + ".tmp"
    body = json.dumps(
        {"members": sorted(peer_set.members), "configured_size": peer_set.configured_size}, indent=2
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (body + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(raft_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
