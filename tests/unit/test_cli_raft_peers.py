"""The State column of ``operator raft list-peers`` (pure: a RaftPeer message in, a word out)."""

from __future__ import annotations

import pytest

from drover.cli.operator import peer_state
from drover.v1 import api_pb2


@pytest.mark.parametrize(
    ("leader", "connected", "state"),
    [
        (True, True, "leader"),
        (False, True, "follower"),
        # A killed server: the leader has no connection to it, so it is not shown as following.
        (False, False, "unreachable"),
    ],
)
def test_peer_state__names_an_unconnected_peer_unreachable(leader: bool, connected: bool, state: str) -> None:
    assert peer_state(api_pb2.RaftPeer(name="s1", leader=leader, connected=connected)) == state
