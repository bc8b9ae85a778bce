"""Autopilot replaces a dead host on a secured cluster, unattended but for the new host:
three real server processes with TLS on every port, ACLs on, and
``-autopilot-cleanup-dead-servers`` with a 2 s threshold.

A follower is killed for good (SIGKILL): the leader removes it from the raft configuration
once it has been silent past the threshold, while writes keep being acknowledged; ``server
members`` then shows it as left. A replacement host joins with ``-join`` over TLS, with the
management token from its environment (joining an ACL cluster takes one), catches up, and
every live server ends on the same digest holding every acknowledged write.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from tests.cluster.conftest import wait_settled
from tests.cluster.writer import Writer

pytestmark = pytest.mark.timeout(240)

AUTOPILOT_ARGS = ("-autopilot-cleanup-dead-servers", "-autopilot-dead-server-threshold", "2s")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", servers=3, tls=True, acl=True, extra_args=AUTOPILOT_ARGS) as c:
        wait_settled(c)
        yield c


def test_autopilot__dead_follower_removed__replacement_joins_over_tls_with_a_token__writes_continue(
    cluster: LocalCluster,
) -> None:
    assert cluster.tls is not None
    secured = {"tls": cluster.tls.cli_files, "token": cluster.management_token}
    originals = list(cluster.grpc_addresses)
    with (
        DroverClient(originals, retry_deadline=30, **secured) as client,
        Writer(originals, **secured) as writer,
    ):
        writer.wait_more(5)
        leader = cluster.wait_for_leader()
        victim = next(n for n in cluster.server_names if n != leader)
        cluster.kill(cluster.server_names.index(victim))

        wait_for(
            lambda: {p.name for p in client.raft_peers().peers} == set(cluster.server_names) - {victim},
            60,
            0.2,
            lambda: f"autopilot to remove {victim}\n" + cluster.logs_tail(),
        )
        writer.wait_more(5)
        members = {m.name: m.status for m in client.server_members().members}
        assert members[victim] == "left", members

        s4 = cluster.add_server("s4")
        wait_for(
            lambda: (
                len(peers := client.raft_peers().peers) == 3
                and "s4" in {p.name for p in peers}
                and all(p.connected for p in peers)
            ),
            60,
            0.2,
            lambda: "s4 to join\n" + cluster.logs_tail(),
        )
        writer.wait_more(5)
    assert not writer.errors, writer.errors
    _digest, applied = cluster.wait_converged(timeout=60)
    assert set(cluster.digests()) == set(cluster.server_names) - {victim} and applied > 0, cluster.digests()
    with DroverClient([cluster.grpc_addresses[s4]], retry_deadline=30, **secured) as only_s4:
        stored = {j.id for j in only_s4.list_jobs(stale=True).jobs}
    assert set(writer.acked) <= stored, sorted(set(writer.acked) - stored)[:5]
