"""Group commit on a real 3-server cluster: concurrent writes share raft entries, each
reports the index of the entry that holds it, a follower's blocking read at that index
sees it, and every server's log (batch entries included) replays offline to equal states.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient
from drover.server.fsm import requests_of
from drover.server.raft.journal import RECORD_COMMAND
from drover.server.raft_tools import open_data_dir
from drover.v1 import raft_pb2, structs_pb2
from tests.cluster.conftest import wait_settled
from tests.cluster.replay import assert_servers_agree, check_every_index

WRITERS = 16
WRITES_EACH = 8


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", servers=3) as c:
        wait_settled(c)
        yield c


def template_job(job_id: str) -> structs_pb2.Job:
    """A periodic batch job that never fires: registering it creates no evaluation."""
    task = structs_pb2.Task(
        name="t", driver="mock", resources=structs_pb2.Resources(cpu_mhz=10, memory_mb=16)
    )
    return structs_pb2.Job(
        id=job_id,
        name=job_id,
        type="batch",
        datacenters=["dc1"],
        periodic=structs_pb2.PeriodicConfig(enabled=True, spec="0 0 1 1 *", time_zone="UTC"),
        groups=[structs_pb2.TaskGroup(name="g", count=1, tasks=[task])],
    )


def _register_concurrently(address: str) -> dict[str, int]:
    """Every writer registers its jobs through ``address``; job ID -> the index it reported."""
    reported: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Barrier(WRITERS)
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with DroverClient([address], retry_deadline=30) as client:
                start.wait(timeout=30)
                for i in range(WRITES_EACH):
                    job_id = f"w{n:02d}-{i}"
                    index = client.register_job(template_job(job_id)).meta.index
                    with lock:
                        reported[job_id] = index
        except BaseException as exc:  # reported below, with the writer's traceback
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if failures:
        raise failures[0]
    return reported


def _entry_of_each_job(data_dir: Path) -> tuple[dict[str, int], int]:
    """Job ID -> raft index of the entry that registered it, and how many entries were batches."""
    where: dict[str, int] = {}
    batches = 0
    with open_data_dir(str(data_dir)) as data:
        for record in data.records:
            if record.kind != RECORD_COMMAND:
                continue
            requests = requests_of(record.data)
            if raft_pb2.LogEntry.FromString(record.data).type == raft_pb2.ENTRY_TYPE_BATCH:
                batches += 1
            for request in requests:
                entry = raft_pb2.LogEntry.FromString(request)
                if entry.type == raft_pb2.ENTRY_TYPE_JOB_REGISTER:
                    job = raft_pb2.JobRegisterEntry.FromString(entry.payload).job
                    where.setdefault(job.id, record.index)
    return where, batches


def test_group_commit__concurrent_writes__share_entries_report_their_entry_index_and_replay_equal(
    cluster: LocalCluster,
) -> None:
    leader = cluster.leader_index(timeout=60)
    reported = _register_concurrently(cluster.grpc_addresses[leader])
    assert len(reported) == WRITERS * WRITES_EACH

    # A follower's blocking read at a write's index holds until it has applied that entry.
    follower = (leader + 1) % 3
    with DroverClient([cluster.grpc_addresses[follower]]) as client:
        for job_id, index in itertools.islice(sorted(reported.items()), 0, None, 7):
            answer = client.get_job(job_id, stale=True, min_index=index - 1, wait_ns=10_000_000_000)
            assert answer.job.id == job_id, f"{job_id} (index {index}) not seen on the follower"
            assert answer.meta.index >= index

    cluster.wait_converged(timeout=60)
    cluster.stop_all()
    where, batches = _entry_of_each_job(cluster.base_dir / cluster.server_names[leader])
    assert batches > 0, f"{WRITERS} concurrent writers never shared a raft entry"
    assert {job_id: where.get(job_id) for job_id in reported} == reported
    reports = [check_every_index(cluster.base_dir / name, []) for name in cluster.server_names]
    assert assert_servers_agree(reports) > 0
