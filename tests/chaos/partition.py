"""Raft partitions on one loopback: drop raft messages between chosen servers, in-process.

Why not the network: pysyncobj identifies a peer by the address it announces (its own
``host:port``), so per-pair TCP proxies would give one server two identities; every server
shares 127.0.0.1, so firewall rules cannot tell which server an outgoing connection comes
from (ephemeral source ports, one uid); and network namespaces would take the cluster off
loopback. So the cut is made where identity is exact: at pysyncobj's transport, inside
each server process, by a test-only wrapper (``python -m tests.chaos.fault_agent``,
which installs the hook and then runs the ordinary ``drover.cli`` agent; product code is
untouched).

The hook drops every raft message sent to, or received from, a blocked peer: TCP
connections stay up (as behind a silent firewall), heartbeats and votes are lost, a cut
leader steps down after ``leaderFallbackTimeout`` and a cut follower campaigns in vain,
raising its term (pysyncobj has no pre-vote), which deposes the leader when the cut heals.
What is *not* cut: gRPC, both from clients and between servers (a cut follower can still
forward a write to the leader it last knew). So this is a raft-level partition, not a
full network partition.

Control: ``PartitionControl`` writes a JSON file (path in ``DROVER_CHAOS_PARTITION_FILE``)
of blocked (from, to) raft-address pairs; each agent polls its modification time every
``POLL_S`` and swaps in the new set.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from tests.chaos.control_file import WatchedFile, write_control

ENV: Final = "DROVER_CHAOS_PARTITION_FILE"


class PartitionControl:
    """The test's side: which servers are cut off, written where the agents look."""

    def __init__(self, path: Path, names: Sequence[str], raft_addresses: Sequence[str]) -> None:
        self.path = path
        self._address = dict(zip(names, raft_addresses, strict=True))
        self._write([])

    def isolate(self, name: str) -> None:
        """Cut ``name`` off from every other server, both directions."""
        me = self._address[name]
        pairs = []
        for other in self._address.values():
            if other != me:
                pairs += [[me, other], [other, me]]
        self._write(pairs)

    def heal(self) -> None:
        self._write([])

    def _write(self, pairs: list[list[str]]) -> None:
        write_control(self.path, {"blocked": pairs})


def _blocked_pairs(data: dict[str, Any]) -> frozenset[tuple[str, str]]:
    return frozenset((str(a), str(b)) for a, b in data.get("blocked", []))


def watch_blocked(path: str) -> WatchedFile[frozenset[tuple[str, str]]]:
    """The agent's side: the current set of blocked (from, to) pairs, kept fresh."""
    return WatchedFile(path, _blocked_pairs, frozenset(), "chaos-partition-poll")


def install(path: str) -> None:
    """Patch pysyncobj's TCP transport in this process to honour the control file."""
    from pysyncobj import transport  # the agent process's own pysyncobj: test-only patch

    blocked = watch_blocked(path)
    original_send = transport.TCPTransport.send
    original_receive = transport.Transport._onMessageReceived

    def send(self: Any, node: Any, message: Any) -> Any:
        if (self._selfNode.address, getattr(node, "address", None)) in blocked.value:
            return False  # as if the connection were down: pysyncobj retries later
        return original_send(self, node, message)

    def on_message_received(self: Any, node: Any, message: Any) -> Any:
        if (getattr(node, "address", None), self._selfNode.address) in blocked.value:
            return None
        return original_receive(self, node, message)

    transport.TCPTransport.send = send
    transport.Transport._onMessageReceived = on_message_received
