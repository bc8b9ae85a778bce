"""The tunnel's RPCs with ACLs on, over a real server process: who may read an alloc's logs,
restart it or read its node's meta, and who may open a node's tunnel at all.

The node's end is played by the test: a simulated node registers through the API and
opens ``Nodes.Connect`` with its own secret, then answers what the server sends down, so
what a caller gets back shows that its call reached the node (or was refused before)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient, DroverError
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node, simulated_secret

NODE = "tunnel-acl-node"
POLICIES = {
    "logs": 'namespace "default" { capabilities = ["read-logs"] }',
    "lifecycle": 'namespace "default" { capabilities = ["alloc-lifecycle"] }',
    "readonly": 'namespace "default" { policy = "read" }\nnode { policy = "read" }',
    "prod-logs": 'namespace "prod" { capabilities = ["read-logs"] }',
}


class FakeNodeEnd:
    """The node's end of ``Nodes.Connect``: logs answer ``b"hello\\n"``, meta reads answer
    ``{"k": "v"}``, restarts succeed; every request is recorded."""

    def __init__(self, address: str, node_id: str, secret: str) -> None:
        self.asked: list[api_pb2.ClientTunnelDown] = []
        self._up: queue.Queue[api_pb2.ClientTunnelUp | None] = queue.Queue()
        self._up.put(api_pb2.ClientTunnelUp(node_id=node_id, secret_id=secret))
        self._channel = grpc.insecure_channel(address)
        self._call = api_pb2_grpc.NodesStub(self._channel).Connect(self._answers())
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _answers(self) -> Iterator[api_pb2.ClientTunnelUp]:
        while True:
            up = self._up.get()
            if up is None:
                return
            yield up

    def _serve(self) -> None:
        try:
            for down in self._call:
                self.asked.append(down)
                op = down.WhichOneof("op")
                if op == "logs":
                    self._up.put(api_pb2.ClientTunnelUp(request_id=down.request_id, data=b"hello\n"))
                done = api_pb2.ClientTunnelUp(request_id=down.request_id, done=True)
                if op == "meta_read":
                    done.meta.CopyFrom(api_pb2.NodeMetaResponse(meta={"k": "v"}, dynamic={"k": "v"}))
                if op != "cancel":
                    self._up.put(done)
        except grpc.RpcError as exc:
            self.error = exc

    def close(self) -> None:
        self._up.put(None)
        self._call.cancel()
        self._channel.close()
        self._thread.join(5)


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("tunnel-acl") / "c", servers=1, acl=True) as cluster:
        cluster.wait_for_leader(60)
        yield cluster


def _client(cluster: LocalCluster, token: str | None) -> DroverClient:
    return DroverClient(cluster.grpc_addresses, retry_deadline=10, token=token)


def _denied(call: object) -> DroverError:
    with pytest.raises(DroverError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED, caught.value
    return caught.value


def test_tunnel__acl__each_rpc_needs_its_capability_on_the_allocs_namespace(
    acl_cluster: LocalCluster,
) -> None:
    cluster = acl_cluster
    tokens: dict[str, str] = {}
    with _client(cluster, cluster.management_token) as admin:
        for name, rules in POLICIES.items():
            admin.acl_upsert_policy(name, rules)
            tokens[name] = admin.acl_create_token(name=name, policies=[name]).token.secret_id
        admin.register_node(simulated_node(NODE))
        admin.register_job(service_job("tunnelled", count=1))

        def placed() -> list[structs_pb2.Allocation]:
            return [a for a in admin.list_allocs(job_id="tunnelled").allocs if a.node_id == NODE]

        (alloc,) = wait_for(placed, 60, 0.1, "the alloc placed on the simulated node")

    # Someone else's secret opens no tunnel for the node.
    impostor = FakeNodeEnd(cluster.grpc_addresses[0], NODE, "not-the-secret")
    wait_for(lambda: impostor.error is not None, 10, 0.05, "the impostor's tunnel to be refused")
    assert impostor.error is not None and impostor.error.code() == grpc.StatusCode.PERMISSION_DENIED
    impostor.close()

    node_end = FakeNodeEnd(cluster.grpc_addresses[0], NODE, simulated_secret(NODE))
    try:
        with _client(cluster, tokens["logs"]) as reader:
            # The server may not hold the session yet: the SDK retries "not connected".
            assert b"".join(reader.alloc_logs(alloc.id)) == b"hello\n"
            _denied(lambda: reader.restart_alloc(alloc.id))
        asked_so_far = len(node_end.asked)
        with _client(cluster, tokens["prod-logs"]) as other_namespace:
            refused = _denied(lambda: b"".join(other_namespace.alloc_logs(alloc.id)))
            assert "namespace 'default'" in str(refused)
        with _client(cluster, tokens["readonly"]) as readonly:
            _denied(lambda: b"".join(readonly.alloc_logs(alloc.id)))
            _denied(lambda: readonly.signal_alloc(alloc.id, signal="HUP"))
            _denied(lambda: readonly.node_meta_apply(NODE, {"a": "b"}))
            assert dict(readonly.node_meta_read(NODE).meta) == {"k": "v"}
        with _client(cluster, None) as anonymous:
            _denied(lambda: b"".join(anonymous.alloc_logs(alloc.id)))
        # None of the refused calls reached the node; the meta read did.
        assert [d.WhichOneof("op") for d in node_end.asked[asked_so_far:]] == ["meta_read"]
        with _client(cluster, tokens["lifecycle"]) as operator:
            operator.restart_alloc(alloc.id)
        assert node_end.asked[-1].WhichOneof("op") == "restart"
    finally:
        node_end.close()
