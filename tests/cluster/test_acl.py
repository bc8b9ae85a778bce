"""ACLs over real processes: three servers with TLS and ACLs on, reached by the SDK and the CLI.

``LocalCluster(acl=True, tls=True)`` starts every server with ``-acl-enabled`` and mTLS and
bootstraps; ``cluster.management_token`` is the management secret. Every check is one an
operator would make: what an anonymous caller, a read token, an operator token and the
management token can and can not do, through a follower (forwarded with the token) and the
leader, and that neither a snapshot nor a server's data dir holds a usable secret.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from deploy.cluster import LocalCluster, wait_for
from drover.common.tls import open_channel
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.cli import drover_cli, one_error_line
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node, simulated_secret

READ_POLICY = """
namespace "default" { policy = "read" }
node { policy = "read" }
"""
OPERATOR_READ_POLICY = 'operator { policy = "read" }'
OPERATOR_WRITE_POLICY = 'operator { policy = "write" }'


def _client(cluster: LocalCluster, token: str | None = None, address: str | None = None) -> DroverClient:
    assert cluster.tls is not None
    addresses = address or cluster.grpc_addresses
    return DroverClient(addresses, retry_deadline=20, tls=cluster.tls.cli_files, token=token)


def _drover(
    cluster: LocalCluster, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI against ``cluster`` over its mTLS, as an operator with the CLI's certificate."""
    assert cluster.tls is not None
    return drover_cli(
        *args, env={**cluster.tls.cli_env, "DROVER_ADDR": ",".join(cluster.grpc_addresses), **(env or {})}
    )


def _denied(call: object) -> DroverError:
    with pytest.raises(DroverError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED, caught.value
    assert str(caught.value).startswith("Permission denied"), caught.value
    return caught.value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("acl") / "c", servers=3, acl=True, tls=True) as c:
        assert c.management_token
        c.wait_for_leader(60)

        def announced() -> bool:
            with _client(c, c.management_token) as client:
                peers = client.raft_peers().peers
            return len(peers) == 3 and all(p.grpc_address for p in peers)

        wait_for(announced, 60, 0.1, "every server to announce its gRPC address")
        with _client(c, c.management_token) as admin:
            admin.acl_upsert_policy("readonly", READ_POLICY, description="read jobs and nodes")
            admin.acl_upsert_policy("operator-read", OPERATOR_READ_POLICY)
            admin.acl_upsert_policy("operator-write", OPERATOR_WRITE_POLICY)
        c.wait_converged(60)
        yield c


@pytest.fixture(scope="module")
def read_token(cluster: LocalCluster) -> str:
    with _client(cluster, cluster.management_token) as admin:
        return admin.acl_create_token(name="reader", policies=["readonly"]).token.secret_id


def _follower(cluster: LocalCluster) -> str:
    leader = cluster.leader_index()
    return cluster.grpc_addresses[(leader + 1) % 3]


def test_acl__plaintext__refused(cluster: LocalCluster) -> None:
    with grpc.insecure_channel(cluster.grpc_addresses[0]) as channel, pytest.raises(grpc.RpcError) as caught:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_acl__anonymous__every_read_and_write_refused_on_every_server(cluster: LocalCluster) -> None:
    for address in cluster.grpc_addresses:
        with _client(cluster, address=address) as anonymous:
            _denied(lambda c=anonymous: c.register_job(service_job("anon")))
            _denied(lambda c=anonymous: c.list_jobs())
            _denied(lambda c=anonymous: c.list_jobs(stale=True))
            _denied(lambda c=anonymous: c.list_nodes())
            _denied(lambda c=anonymous: c.list_allocs())
            _denied(lambda c=anonymous: c.raft_peers())
            _denied(lambda c=anonymous: c.state_digest())
            _denied(lambda c=anonymous: c.acl_list_tokens())


def test_acl__unknown_token__refused_not_treated_as_anonymous(cluster: LocalCluster) -> None:
    with _client(cluster, token="00000000-0000-4000-8000-000000000000") as stranger:
        error = _denied(lambda: stranger.list_jobs())
    assert "ACL token not found" in str(error)


def test_acl__read_token__reads_through_a_follower_and_cannot_write(
    cluster: LocalCluster, read_token: str
) -> None:
    with _client(cluster, cluster.management_token) as admin:
        admin.register_job(service_job("visible"))
    with _client(cluster, read_token, address=_follower(cluster)) as reader:
        assert "visible" in [j.id for j in reader.list_jobs().jobs]
        assert reader.get_job("visible").job.id == "visible"
        reader.list_nodes()
        assert reader.acl_token_self().token.policies == ["readonly"]
        _denied(lambda: reader.register_job(service_job("sneaky")))
        _denied(lambda: reader.deregister_job("visible"))
        _denied(lambda: reader.update_eligibility("some-node", "ineligible"))
        _denied(lambda: reader.reconcile_summaries())
        _denied(lambda: reader.acl_create_token(name="escalate", token_type="management"))
        # A client token sees only its own policies.
        assert [p.name for p in reader.acl_list_policies().policies] == ["readonly"]
        _denied(lambda: reader.acl_get_policy("operator-write"))
    with _client(cluster, cluster.management_token) as admin:
        assert "sneaky" not in [j.id for j in admin.list_jobs().jobs]


def test_acl__management__does_everything(cluster: LocalCluster) -> None:
    with _client(cluster, cluster.management_token, address=_follower(cluster)) as admin:
        response = admin.register_job(service_job("managed"))
        assert response.eval_id
        assert admin.get_job("managed").job.id == "managed"
        assert admin.reconcile_summaries().meta.index > 0
        assert len(admin.raft_peers().peers) == 3
        snapshot = admin.snapshot_save().snapshot
        assert admin.snapshot_restore(snapshot).meta.index > 0
        # The restore kept the ACL tables of the snapshot: the token still works.
        assert admin.acl_token_self().token.type == "management"
        assert admin.deregister_job("managed", purge=True).meta.index > 0


def test_acl__snapshots__need_operator_write_and_restore_needs_management(
    cluster: LocalCluster, read_token: str
) -> None:
    with _client(cluster, cluster.management_token) as admin:
        snapshot = admin.snapshot_save().snapshot
        operator_read = admin.acl_create_token(name="op-r", policies=["operator-read"]).token.secret_id
        operator_write = admin.acl_create_token(name="op-w", policies=["operator-write"]).token.secret_id
    for token in (None, read_token, operator_read):
        with _client(cluster, token) as caller:
            _denied(lambda c=caller: c.snapshot_save())
            _denied(lambda c=caller: c.snapshot_save(stale=True))
            _denied(lambda c=caller: c.snapshot_restore(snapshot))
    with _client(cluster, operator_read) as reader:
        assert len(reader.raft_peers().peers) == 3
        _denied(lambda: reader.reconcile_summaries())
    with _client(cluster, operator_write) as operator:
        assert operator.snapshot_save().snapshot.index > 0
        assert operator.reconcile_summaries().meta.index > 0
        # A restore replaces the ACL tables: only management may.
        _denied(lambda: operator.snapshot_restore(snapshot))


def test_acl__bootstrap_twice__refused_sdk_and_cli(cluster: LocalCluster) -> None:
    with _client(cluster) as anonymous, pytest.raises(DroverError) as caught:
        anonymous.acl_bootstrap()
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "ACL bootstrap already done" in str(caught.value)

    line = one_error_line(_drover(cluster, "acl", "bootstrap"))
    assert line.startswith("Error: ACL bootstrap already done (reset index: ")


def test_acl__cli__token_from_flag_and_env_and_one_line_when_denied(cluster: LocalCluster) -> None:
    assert cluster.management_token
    created = _drover(
        cluster, "acl", "token", "create", "-name", "cli", "-policy", "readonly", "-json",
        env={"DROVER_TOKEN": cluster.management_token},
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    secret = json.loads(created.stdout)["secret_id"]

    listed = _drover(cluster, "job", "status", "-token", secret)
    assert listed.returncode == 0, listed.stderr

    line = one_error_line(_drover(cluster, "job", "status"))
    assert line == "Error: Permission denied: Jobs.List needs list-jobs on some namespace"
    line = one_error_line(_drover(cluster, "system", "reconcile", "summaries", "-token", secret))
    assert line == 'Error: Permission denied: Operator.ReconcileSummaries needs operator = "write"'


def test_acl__deleted_token__stops_working_on_every_server(cluster: LocalCluster) -> None:
    with _client(cluster, cluster.management_token) as admin:
        minted = admin.acl_create_token(name="short-lived", policies=["readonly"]).token
    with _client(cluster, minted.secret_id) as holder:
        holder.list_jobs()

    with _client(cluster, cluster.management_token) as admin:
        admin.acl_delete_token(minted.accessor_id)

    def refused_everywhere() -> bool:
        for address in cluster.grpc_addresses:
            with _client(cluster, minted.secret_id, address=address) as holder:
                try:
                    holder.list_jobs(stale=True)  # answered by that server from its own state
                except DroverError as exc:
                    assert exc.code == grpc.StatusCode.PERMISSION_DENIED
                    continue
                return False
        return True

    wait_for(refused_everywhere, 30, 0.1, "the deleted token to be refused by every server")
    with _client(cluster, minted.secret_id) as holder:
        _denied(lambda: holder.list_jobs())


def test_acl__health_open_reflection_off(cluster: LocalCluster) -> None:
    assert cluster.tls is not None
    with open_channel(cluster.grpc_addresses[0], cluster.tls.cli_files.load()) as channel:
        # SERVING once health's watcher has seen the leader and a quorum (server/api/health.py).
        def serving() -> bool:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

        wait_for(serving, 30, 0.1, "health to say SERVING")
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_acl__no_secret_in_snapshots_or_data_dirs(
    cluster: LocalCluster, read_token: str, tmp_path: Path
) -> None:
    assert cluster.management_token
    secrets = [cluster.management_token.encode(), read_token.encode()]
    with _client(cluster, cluster.management_token) as admin:
        snapshot = admin.snapshot_save().snapshot
    blob = snapshot.SerializeToString()
    assert len(snapshot.acl_tokens) >= 2  # the tokens are in it: only their hashes
    for secret in secrets:
        assert secret not in blob

    saved = _drover(
        cluster,
        "operator",
        "snapshot",
        "save",
        str(tmp_path / "state.snap"),
        "-token",
        cluster.management_token,
    )
    assert saved.returncode == 0, saved.stderr
    on_disk = [p for s in cluster.server_names for p in (cluster.base_dir / s).rglob("*") if p.is_file()]
    on_disk.append(tmp_path / "state.snap")
    assert len(on_disk) > 3
    for path in on_disk:
        data = path.read_bytes()
        for secret in secrets:
            assert secret not in data, f"{path} holds a token secret"

    # The offline state dump of a stopped server: every table as JSON, no secret in it.
    stopped = 2 if cluster.leader_index() != 2 else 1
    cluster.stop(stopped)
    dump = _drover(
        cluster,
        "operator",
        "raft",
        "state",
        "-data-dir",
        str(cluster.base_dir / cluster.server_names[stopped]),
    )
    assert dump.returncode == 0, dump.stderr
    assert '"acl_tokens"' in dump.stdout
    for secret in secrets:
        assert secret.decode() not in dump.stdout


def test_acl__stopped_server_back__authorizes_from_its_replayed_state(
    cluster: LocalCluster, read_token: str
) -> None:
    for i in range(3):
        if not cluster.is_alive(i):
            cluster.restart(i)
    cluster.wait_converged(60)
    for address in cluster.grpc_addresses:
        with _client(cluster, read_token, address=address) as reader:
            reader.list_jobs(stale=True)
            _denied(lambda c=reader: c.snapshot_save(stale=True))


def test_acl__node_rpcs__need_the_nodes_own_secret_not_a_token(cluster: LocalCluster) -> None:
    """Client agents hold no ACL token: their node RPCs are authenticated by the node's own
    secret (empty refused), and one node's secret can not touch another node's alloc."""
    with _client(cluster) as node_agent:
        for node_id in ("acl-node-a", "acl-node-b"):
            node_agent.register_node(simulated_node(node_id))
    with _client(cluster, cluster.management_token) as admin:
        admin.register_job(service_job("on-one-node", count=1))

        def placed() -> list[structs_pb2.Allocation]:
            return [a for a in admin.list_allocs(job_id="on-one-node").allocs if a.desired_status == "run"]

        (alloc,) = wait_for(placed, 60, 0.1, "the alloc of on-one-node to be placed")
    owner = alloc.node_id
    other = "acl-node-b" if owner == "acl-node-a" else "acl-node-a"
    report = structs_pb2.Allocation(id=alloc.id, client_status="failed")
    with _client(cluster) as node_agent:
        for node_id, secret in (
            (other, simulated_secret(other)),
            (owner, ""),
            (owner, simulated_secret(other)),
        ):
            with pytest.raises(DroverError) as caught:
                node_agent.update_allocs([report], node_id=node_id, secret_id=secret)
            assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED, (node_id, secret, caught.value)
        with pytest.raises(DroverError) as caught:
            node_agent.update_node_status(owner, "ready")
        assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        # The owner's own secret works with no ACL token at all.
        node_agent.update_node_status(owner, "ready", secret_id=simulated_secret(owner))
    with _client(cluster, cluster.management_token) as admin:
        assert admin.get_alloc(alloc.id).alloc.client_status != "failed"
