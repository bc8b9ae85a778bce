"""A rolling upgrade across the GCM seal (server/raft/seal.py): real server processes on
loopback, one of them speaking raft as the releases before it (tests/cluster/
_older_wire_agent.py). The cluster must commit with the older server in every quorum, and
no frame may be refused on the way."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient
from tests.cluster._older_wire_agent import OLDER_WIRE_ENV
from tests.cluster.jobs import service_job

OLDER = "s3"


@pytest.mark.timeout(180)
def test_mixed_releases__commit_with_the_older_server_in_the_quorum_and_refuse_no_frame(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(
        tmp_path,
        servers=3,
        env={OLDER_WIRE_ENV: OLDER},
        agent_module="tests.cluster._older_wire_agent",
    )
    with cluster:
        cluster.wait_for_leader(60)
        older = cluster.server_names.index(OLDER)
        with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
            for n in range(10):
                client.register_job(service_job(f"seal-all-{n}", count=0))
            cluster.wait_converged(60)

            # One of the current servers goes: every commit now needs the older one.
            gone = next(i for i in range(3) if i != older)
            cluster.stop(gone)
            indexes = [
                client.register_job(service_job(f"seal-mixed-{n}", count=0)).meta.index for n in range(10)
            ]

        # Every write was acknowledged, so committed by the older server and the one current
        # server left; both hold all of them.
        _, applied = cluster.wait_converged(60)
        assert applied >= max(indexes)
        for i in range(3):
            assert "raft.frame_refused" not in cluster.log(i), cluster.log(i)[-3000:]
