"""A leader cut off from the others answers no default read; a stale read it still answers.

The leader's raft traffic is cut (tests/chaos/partition.py, through the chaos suite's
test-only agent wrapper; gRPC still reaches it). It goes on believing it leads until its
fallback timeout (5 s) while the other two elect a new leader, which acknowledges a write.
A default read sent to the cut-off leader in that window must not answer from its state
(which lacks the write): it confirms its leadership with a majority first, and can not
(server/raft/read_confirm.py), so it answers UNAVAILABLE. A stale read is answered there,
from its own state, as ``-stale`` promises.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient, DroverError
from tests.chaos.partition import ENV as PARTITION_ENV
from tests.chaos.partition import PartitionControl
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import service_job


def test_leader_reads__cut_off_leader__default_read_refused_stale_read_answered(tmp_path: Path) -> None:
    control_file = tmp_path / "partition.json"
    with LocalCluster(
        tmp_path / "cluster",
        servers=3,
        env={PARTITION_ENV: str(control_file)},
        agent_module="tests.chaos.fault_agent",
    ) as cluster:
        wait_settled(cluster)
        partition = PartitionControl(control_file, cluster.server_names, cluster.raft_addresses)
        old = cluster.leader_index()
        others = [a for i, a in enumerate(cluster.grpc_addresses) if i != old]
        with DroverClient(cluster.grpc_addresses[old], retry_deadline=0.5) as cut_off:
            partition.isolate(cluster.server_names[old])

            def new_leader() -> str | None:
                for address in others:
                    with DroverClient(address, retry_deadline=0.5) as one:
                        if one.state_digest().leader:
                            return address
                return None

            elected = wait_for(new_leader, 10, 0.05, "the other two to elect a leader")
            with DroverClient(elected, retry_deadline=5) as majority:
                majority.register_job(service_job("later", count=1))
            assert cut_off.state_digest().leader, "the cut-off server should still believe it leads"

            with pytest.raises(DroverError) as refused:
                cut_off.get_job("later")
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE, refused.value
            with pytest.raises(DroverError) as stale:
                cut_off.get_job("later", stale=True)
            assert stale.value.code == grpc.StatusCode.NOT_FOUND, stale.value
            assert cut_off.state_digest().leader, "the read must have been refused while it still led"

            partition.heal()
            with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
                wait_for(lambda: client.get_job("later").job.id == "later", 30, 0.2, "the job readable again")
