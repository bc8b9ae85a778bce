"""Node identity over real processes: a server and a real client agent, plus two nodes
registered through the API the way a client registers (tests/cluster/nodes.py).

Each node call needs the node's own secret: an empty one is refused, one node's secret
can not read or report another node's allocs, re-registering a node ID needs its secret,
and no read API, snapshot or ``operator raft state`` dump holds a secret.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.common.secrets import hash_secret
from drover.sdk import DroverClient, DroverError
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node, simulated_secret
from tests.cluster.test_metrics_http import scrape, value


def pinned_job(job_id: str, node_id: str) -> structs_pb2.Job:
    job = service_job(job_id, count=1)
    job.constraints.add(attribute="${node.unique.id}", operator="=", value=node_id)
    return job


class Rig:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.api = DroverClient(cluster.grpc_addresses, retry_deadline=30)

    def digest(self) -> tuple[str, int]:
        answer = self.cluster.query_digest(0)
        assert answer is not None
        return answer.digest, answer.applied_index

    def alloc_on(self, job_id: str, node_id: str) -> structs_pb2.Allocation:
        def placed() -> structs_pb2.Allocation | None:
            allocs = [a for a in self.api.list_allocs(job_id=job_id).allocs if a.node_id == node_id]
            return allocs[0] if allocs else None

        found = wait_for(placed, 60, 0.1, f"an alloc of {job_id} on {node_id}")
        assert found is not None
        return found

    def refused(self, call: Callable[[], object]) -> DroverError:
        """``call`` fails with PERMISSION_DENIED and the state is as it was."""
        before = self.digest()
        with pytest.raises(DroverError) as err:
            call()
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED, err.value
        assert "Permission denied" in err.value.message
        assert self.digest() == before
        return err.value


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with LocalCluster(tmp_path_factory.mktemp("node-identity"), servers=1, clients=1) as cluster:
        wait_settled(cluster)
        r = Rig(cluster)
        for node_id in ("n1", "n2"):
            r.api.register_node(simulated_node(node_id))
        r.api.register_job(pinned_job("on-n1", "n1"))
        r.api.register_job(pinned_job("on-n2", "n2"))
        # Both placed and every eval of theirs done: a refused call is checked against a
        # state nothing else is still writing to.
        for job_id, node_id in (("on-n1", "n1"), ("on-n2", "n2")):
            r.alloc_on(job_id, node_id)
            wait_for(
                lambda job_id=job_id: all(
                    e.status in ("complete", "failed", "canceled")
                    for e in r.api.list_evals(job_id=job_id).evals
                ),
                60,
                0.1,
                f"{job_id}'s evaluations to finish",
            )
        try:
            yield r
        finally:
            r.api.close()


def _real_client_ready(rig: Rig) -> tuple[str, str] | None:
    """The real client's (node ID, secret) from its data dir, once the servers have it ready."""
    path = rig.cluster.client_data_dir(0) / "client" / "node.json"
    try:
        data = json.loads(path.read_text())
        ready = rig.api.get_node(str(data["node_id"])).node.status == "ready"
    except (OSError, ValueError, DroverError):
        return None
    return (str(data["node_id"]), str(data["secret_id"])) if ready else None


def test_real_client__registers_and_only_its_secrets_hash_is_kept(rig: Rig) -> None:
    identity = wait_for(lambda: _real_client_ready(rig), 60, 0.1, "the real client ready")
    assert identity is not None
    node_id, secret = identity

    read = rig.api.get_node(node_id).node
    assert not read.secret_id and not read.secret_hash
    assert all(not n.secret_id and not n.secret_hash for n in rig.api.list_nodes().nodes)

    snap = rig.api.snapshot_save().snapshot
    stored = {n.id: n for n in snap.nodes}
    assert stored[node_id].secret_hash == hash_secret(secret) and not stored[node_id].secret_id
    assert stored["n1"].secret_hash == hash_secret(simulated_secret("n1"))
    raw = snap.SerializeToString()
    for plain in (secret, simulated_secret("n1"), simulated_secret("n2")):
        assert plain.encode() not in raw


def test_empty_secret__every_node_call_refused(rig: Rig) -> None:
    alloc = rig.alloc_on("on-n1", "n1")
    report = structs_pb2.Allocation(id=alloc.id, client_status="failed")
    rig.refused(lambda: rig.api.update_node_status("n1", "down"))
    rig.refused(lambda: rig.api.update_allocs([report], node_id="n1"))
    rig.refused(lambda: rig.api.update_allocs([report]))
    rig.refused(lambda: rig.api.get_client_allocs("n1", ""))
    rig.refused(lambda: next(iter(rig.api.watch_client_allocs("n1", ""))))


def test_other_nodes_secret__can_not_touch_an_alloc(rig: Rig) -> None:
    alloc = rig.alloc_on("on-n1", "n1")
    report = structs_pb2.Allocation(id=alloc.id, client_status="failed")
    n2 = simulated_secret("n2")

    err = rig.refused(lambda: rig.api.update_allocs([report], node_id="n2", secret_id=n2))
    assert "is not on node" in err.message
    rig.refused(lambda: rig.api.update_allocs([report], node_id="n1", secret_id=n2))
    rig.refused(lambda: rig.api.get_client_allocs("n1", n2))
    rig.refused(lambda: rig.api.update_node_status("n1", "down", secret_id=n2))
    assert rig.api.get_alloc(alloc.id).alloc.client_status != "failed"


def test_heartbeat_stream__every_beat_needs_the_nodes_own_secret(rig: Rig) -> None:
    """``Nodes.Heartbeat``, the stream the client agent beats on, serves each message as an
    UpdateStatus call: n1's beats with its own secret are answered in turn, and a beat for
    n1 with n2's secret ends the stream PERMISSION_DENIED and changes nothing."""
    own = api_pb2.NodeUpdateStatusRequest(node_id="n1", status="ready", secret_id=simulated_secret("n1"))
    forged = api_pb2.NodeUpdateStatusRequest(node_id="n1", status="down", secret_id=simulated_secret("n2"))
    with grpc.insecure_channel(rig.cluster.grpc_addresses[0]) as channel:
        stub = api_pb2_grpc.NodesStub(channel)
        answers = list(stub.Heartbeat(iter([own, own, own]), timeout=30))
        assert len(answers) == 3 and all(a.heartbeat_ttl_ns > 0 for a in answers)
        before = rig.digest()
        after_forged: list[api_pb2.NodeUpdateStatusResponse] = []
        with pytest.raises(grpc.RpcError) as refused:
            after_forged.extend(stub.Heartbeat(iter([own, forged, own]), timeout=30))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
    assert len(after_forged) == 1, "answered up to the forged beat, and nothing after it"
    assert rig.digest() == before
    assert rig.api.get_node("n1").node.status == "ready"


def test_own_secret__reads_and_reports_its_own_allocs(rig: Rig) -> None:
    alloc = rig.alloc_on("on-n2", "n2")
    secret = simulated_secret("n2")
    mine = rig.api.get_client_allocs("n2", secret).allocs
    assert [a.id for a in mine] == [alloc.id]
    rig.api.update_allocs(
        [structs_pb2.Allocation(id=alloc.id, client_status="running")], node_id="n2", secret_id=secret
    )
    wait_for(
        lambda: rig.api.get_alloc(alloc.id).alloc.client_status == "running", 30, 0.1, "the report applied"
    )


def test_reregister__existing_node_with_another_secret__refused(rig: Rig) -> None:
    impostor = simulated_node("n1")
    impostor.secret_id = "not-n1s-secret"
    impostor.attributes["owned"] = "yes"
    rig.refused(lambda: rig.api.register_node(impostor))
    assert "owned" not in rig.api.get_node("n1").node.attributes
    rig.api.register_node(simulated_node("n1"))  # its own secret: fine


def test_register__empty_secret__refused(rig: Rig) -> None:
    anonymous = simulated_node("n3")
    anonymous.secret_id = ""
    rig.refused(lambda: rig.api.register_node(anonymous))


def test_raft_state_and_logs__hold_no_node_secret(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1) as cluster:
        wait_settled(cluster)
        with DroverClient(cluster.grpc_addresses) as api:
            api.register_node(simulated_node("n1"))
            api.update_node_status("n1", "ready", secret_id=simulated_secret("n1"))
        cluster.stop(0)
        data_dir = cluster.base_dir / cluster.server_names[0]
        for command in (["operator", "raft", "state"], ["operator", "raft", "logs"]):
            result = subprocess.run(
                [sys.executable, "-m", "drover.cli", *command, "-data-dir", str(data_dir)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, result.stderr
            assert '"n1"' in result.stdout
            assert simulated_secret("n1") not in result.stdout, command
            assert hash_secret(simulated_secret("n1")) in result.stdout or command[-1] == "logs"


def test_heartbeat_stream__on_a_follower__relayed_to_the_leader_on_one_stream(tmp_path: Path) -> None:
    """A follower relays a caller's heartbeat stream to the leader as one stream of its own
    (server/api/_aio.py ``_Relay``), not a forwarded call a beat: the beats are answered,
    the leader counts them as UpdateStatus calls and the relay, once the caller's stream
    has ended, as one Heartbeat stream; a forged beat ends the caller's stream with the
    leader's PERMISSION_DENIED."""
    with LocalCluster(tmp_path / "c", servers=3) as cluster:
        wait_settled(cluster)
        with DroverClient(cluster.grpc_addresses, retry_deadline=30) as api:
            api.register_node(simulated_node("n1"))
        leader = cluster.leader_index()
        follower = next(i for i in range(3) if i != leader)
        own = api_pb2.NodeUpdateStatusRequest(node_id="n1", status="ready", secret_id=simulated_secret("n1"))
        forged = api_pb2.NodeUpdateStatusRequest(node_id="n1", status="down", secret_id="not-n1s-secret")
        with grpc.insecure_channel(cluster.grpc_addresses[follower]) as channel:
            stub = api_pb2_grpc.NodesStub(channel)
            answers = list(stub.Heartbeat(iter([own, own, own]), timeout=30))
            assert len(answers) == 3 and all(a.heartbeat_ttl_ns > 0 for a in answers)
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Heartbeat(iter([own, forged, own]), timeout=30))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value

        def relayed() -> tuple[float, float] | None:
            samples = scrape(cluster.http_address(leader))
            beats = value(samples, "drover_rpc_requests_total", method="Nodes.UpdateStatus", code="OK")
            streams = value(samples, "drover_rpc_requests_total", method="Nodes.Heartbeat")
            return (beats, streams) if beats >= 4 and streams >= 2 else None

        beats, streams = wait_for(relayed, 30, 0.2, "the leader to count the relayed beats and streams")
        assert streams == 2, "one relay stream per caller stream, not one call per beat"
        assert beats == 4
        with DroverClient(cluster.grpc_addresses, retry_deadline=30) as api:
            assert api.get_node("n1").node.status == "ready"

            # The follower becomes the leader while a caller's stream is relayed: the next
            # beat is served there, and the relay to the old leader is closed at once, not
            # held idle for as long as the caller's stream lives.
            requests: queue.SimpleQueue[api_pb2.NodeUpdateStatusRequest | None] = queue.SimpleQueue()
            with grpc.insecure_channel(cluster.grpc_addresses[follower]) as channel:
                answers = api_pb2_grpc.NodesStub(channel).Heartbeat(iter(requests.get, None), timeout=60)
                requests.put(own)
                assert next(answers).heartbeat_ttl_ns > 0
                api.raft_transfer_leadership(name=cluster.server_names[follower])
                assert cluster.wait_for_leader() == cluster.server_names[follower]
                requests.put(own)
                assert next(answers).heartbeat_ttl_ns > 0

                def relay_closed() -> bool:
                    samples = scrape(cluster.http_address(leader))
                    return value(samples, "drover_rpc_requests_total", method="Nodes.Heartbeat") >= 3

                wait_for(relay_closed, 30, 0.2, "the relay to the old leader closed")
                requests.put(None)
