"""Power loss in the middle of a write burst: every acknowledged write survives, on every server.

The three servers run ``tests.cluster.power_loss_agent``: their raft journals keep every
write they have not synced in memory, and SIGUSR2 ends the process at once, so only what
was synced is on disk, as after a power cut (tests/fixtures/power_loss.py). One round:

1. writers register jobs (a distinct ID each) through all three servers, and record every
   write the cluster acknowledged;
2. a follower loses power; the leader and the other follower alone acknowledge writes now;
3. once more writes are acknowledged, the leader and that follower lose power together
   (a majority, mid-burst): the writes since step 2 exist only on their disks;
4. all three start again, elect a leader and converge;
5. every acknowledged write is in every server's own state (stale reads of each), the
   state digests and applied indexes agree, and no server reports an invariant violation;
   at the end, stopped, every journal replays offline to states that agree.

The must-fail case runs the same round on a disk whose sync writes nothing (pysyncobj's
own journal under a power cut): it must find acknowledged writes missing, or the round
proves nothing. The long version (``-m chaos``) runs many rounds on one cluster.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import periodic_job
from tests.cluster.power_loss_agent import DISK_ENV, POWER_OFF_SIGNAL
from tests.cluster.replay import assert_servers_agree, check_every_index

AGENT = "tests.cluster.power_loss_agent"
WRITERS = 4
# Writes acknowledged by the leader and one follower alone before they lose power.
WRITES_AFTER_FIRST_LOSS = 40
CHAOS_ROUNDS = int(os.environ.get("DROVER_POWER_LOSS_ROUNDS", "12"))


@dataclass
class Burst:
    """Writers registering ``pl-<round>-<writer>-<n>`` until stopped; what was acknowledged."""

    addresses: list[str]
    round_no: int
    acked: list[str] = field(default_factory=list)
    failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for w in range(WRITERS):
            thread = threading.Thread(target=self._write, args=(w,), name=f"power-loss-writer-{w}")
            thread.start()
            self._threads.append(thread)

    def _write(self, writer: int) -> None:
        with DroverClient(self.addresses, timeout=2, retry_deadline=2, connect_timeout=2) as client:
            n = 0
            while not self._stop.is_set():
                job_id = f"pl-{self.round_no}-{writer}-{n}"
                n += 1
                try:
                    client.register_job(periodic_job(job_id))
                except Exception:  # no leader, server gone, outcome unknown: not acknowledged
                    with self._lock:
                        self.failures += 1
                    time.sleep(0.05)
                    continue
                with self._lock:
                    self.acked.append(job_id)

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self._threads), "a writer did not stop"


def power_off(cluster: LocalCluster, *servers: int) -> None:
    """Cut the power of ``servers`` together; returns once each has exited."""
    for i in servers:
        cluster.kill(i, POWER_OFF_SIGNAL)
    for i in servers:
        wait_for(lambda i=i: not cluster.is_alive(i), 20, 0.02, f"{cluster.server_names[i]} to power off")
        assert "power off:" in cluster.log(i), (
            f"{cluster.server_names[i]} exited, but not by its power switch"
        )


def missing_writes(cluster: LocalCluster, acked: set[str]) -> dict[str, list[str]]:
    """Per server, the acknowledged writes its own state lacks (empty lists: none lost)."""
    missing: dict[str, list[str]] = {}
    for i, name in enumerate(cluster.server_names):
        with DroverClient([cluster.grpc_addresses[i]], retry_deadline=30) as client:
            present = {j.id for j in client.list_jobs(prefix="pl-", stale=True).jobs}
        missing[name] = sorted(acked - present)
    return missing


def power_loss_round(cluster: LocalCluster, round_no: int) -> tuple[list[str], int]:
    """One round (module docstring); the writes acknowledged, the un-synced bytes lost."""
    leader = cluster.leader_index(timeout=60)
    first, second = [i for i in range(3) if i != leader]
    burst = Burst(list(cluster.grpc_addresses), round_no)
    burst.start()
    try:
        wait_for(lambda: burst.count() >= 20, 60, 0.02, "writes acknowledged by the whole cluster")
        power_off(cluster, first)
        after = burst.count()
        wait_for(
            lambda: burst.count() >= after + WRITES_AFTER_FIRST_LOSS,
            60,
            0.02,
            "writes acknowledged by the leader and one follower",
        )
        power_off(cluster, leader, second)
    finally:
        burst.stop()
    lost = sum(_lost_bytes(cluster.log(i)) for i in range(3))
    for i in (first, leader, second):
        cluster.restart(i)
    cluster.wait_for_leader(timeout=60)
    cluster.wait_converged(timeout=60)
    return burst.acked, lost


def _lost_bytes(log: str) -> int:
    """What the last power off of this server lost (its line in the server's log)."""
    lines = [line for line in log.splitlines() if line.startswith("power off:")]
    return int(lines[-1].split()[2]) if lines else 0


def tail_cuts(cluster: LocalCluster) -> int:
    """How many torn or corrupt journal tails the servers cut on restart, all rounds."""
    return sum(cluster.log(i).count("raft.journal_tail_cut") for i in range(3))


def assert_durable(cluster: LocalCluster, acked: set[str]) -> None:
    assert acked, "no write was acknowledged: the round proves nothing"
    missing = missing_writes(cluster, acked)
    assert all(not ids for ids in missing.values()), {name: ids[:10] for name, ids in missing.items()}
    # Equal digests at one applied index (the servers may still append their own
    # announcements after a restart, so this waits for a moment they agree).
    assert all(cluster.is_alive(i) for i in range(3))
    cluster.wait_converged(timeout=60)
    for address in cluster.grpc_addresses:
        with DroverClient([address], retry_deadline=30) as client:
            answer = client.invariants()
        assert list(answer.violations) == [], f"{answer.server}: {list(answer.violations)}"


def assert_journals_agree(cluster: LocalCluster) -> None:
    """Stopped: each server's journal (the format after the power cuts, tails cut) replays
    offline, and the states agree wherever two journals hold the same entry."""
    cluster.stop_all()
    reports = [check_every_index(cluster.base_dir / name, []) for name in cluster.server_names]
    assert assert_servers_agree(reports) > 0


@pytest.fixture
def power_loss_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", servers=3, agent_module=AGENT) as c:
        wait_settled(c)
        yield c


@pytest.mark.timeout(180)
def test_power_loss__majority_mid_burst__every_acknowledged_write_on_every_server(
    power_loss_cluster: LocalCluster,
) -> None:
    acked, lost = power_loss_round(power_loss_cluster, 0)

    assert_durable(power_loss_cluster, set(acked))
    assert lost > 0, "no server lost an un-synced write: the power went between bursts"
    cuts = tail_cuts(power_loss_cluster)
    assert_journals_agree(power_loss_cluster)
    print(
        f"\npower loss: {len(acked)} writes acknowledged, {lost} un-synced journal bytes lost, {cuts} torn tails cut"
    )


@pytest.mark.timeout(180)
def test_power_loss__disk_that_never_syncs__acknowledged_writes_are_lost(tmp_path: Path) -> None:
    """The must-fail case: the same round finds the loss on a journal that never syncs."""
    with LocalCluster(
        tmp_path / "cluster", servers=3, agent_module=AGENT, env={DISK_ENV: "lying"}
    ) as cluster:
        wait_settled(cluster)
        acked, _lost = power_loss_round(cluster, 0)

        missing = missing_writes(cluster, set(acked))
        assert any(missing.values()), "a journal that never syncs lost nothing: the check is blind"


@pytest.mark.chaos
@pytest.mark.timeout(60 * CHAOS_ROUNDS + 120)
def test_power_loss__many_rounds__every_acknowledged_write_survives(power_loss_cluster: LocalCluster) -> None:
    acked: set[str] = set()
    lost = 0
    for round_no in range(CHAOS_ROUNDS):
        written, lost_now = power_loss_round(power_loss_cluster, round_no)
        acked |= set(written)
        lost += lost_now
        assert_durable(power_loss_cluster, acked)
    assert lost > 0, "no server lost an un-synced write: the power never went mid-burst"
    cuts = tail_cuts(power_loss_cluster)
    assert_journals_agree(power_loss_cluster)
    print(
        f"\npower loss: {CHAOS_ROUNDS} rounds, {len(acked)} writes acknowledged, {lost} un-synced "
        f"bytes lost, {cuts} torn tails cut"
    )
