"""Autopilot's dead-server cleanup: which voter the leader removes, decided as a value.

With ``-autopilot-cleanup-dead-servers`` the leader removes a server that has not answered
an append for longer than the threshold (``-autopilot-dead-server-threshold``), so a host
that died for good stops counting in the quorum and a replacement can join. It never
takes the configuration below a quorum of its configured size (the most voters this
server has seen, server/raft/peers_file.py): a five-server cluster that lost three keeps
five voters, waiting for an operator, instead of shrinking to two and calling that a
majority. One server per decision: pysyncobj takes one membership change at a time.

``dead_server_to_remove`` is pure: the leader's loop (server/membership.py) reads the
ages and the configuration, calls it, and performs what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["AutopilotSettings", "dead_server_to_remove", "quorum"]


@dataclass(frozen=True, slots=True)
class AutopilotSettings:
    cleanup_dead_servers: bool = False
    # Seconds a voter may go without answering the leader before it counts as dead.
    dead_server_threshold_s: float = 60.0


def quorum(voters: int) -> int:
    """The fewest voters that make a majority of ``voters``."""
    return voters // 2 + 1


def dead_server_to_remove(
    settings: AutopilotSettings,
    *,
    leader: str,
    members: Sequence[str],
    silent_for_s: Mapping[str, float],
    configured_size: int,
) -> str | None:
    """The raft address of the voter to remove now, or None.

    ``silent_for_s``: seconds since each follower last answered the leader (a follower
    missing from it has not been heard of at all by this leader: it is not judged yet).
    The longest-silent dead server goes first; the leader never removes itself."""
    if not settings.cleanup_dead_servers:
        return None
    if len(members) - 1 < quorum(max(configured_size, 1)):
        return None
    dead = [
        (silent_for_s[m], m)
        for m in members
        if m != leader and m in silent_for_s and silent_for_s[m] > settings.dead_server_threshold_s
    ]
    if not dead:
        return None
    return max(dead)[1]
