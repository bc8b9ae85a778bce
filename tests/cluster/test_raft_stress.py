"""Raft under stress: 100,000 writes in bursts on 3 real servers (docs/design.md, pysyncobj defects).

Every replica must reach the same applied index and state digest after every burst, no
server may log an exception loop (pysyncobj's "failed _onTick" / IndexError after a follower's
log was emptied), and no follower may truncate entries it had already applied (pysyncobj's
"truncating already-applied log entries ... may have diverged", the defect
server/raft/append.py exists to prevent). Log compaction runs several times during the test:
group commit (server/write_batch.py) packs several writes into one raft entry, so the
servers run with a snapshot threshold well below the writes of one burst. The write rate is
printed, not asserted: it is a benchmark figure.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient
from tests.cluster.conftest import wait_settled
from tests.cluster.stress_writer import JOB_IDS, write_burst

TOTAL_WRITES = int(os.environ.get("DROVER_STRESS_WRITES", "100000"))
BURSTS = 10
# make test's bounded run: bursts of the long run's size (10,000 writes, so every server
# compacts during each: see SNAPSHOT_THRESHOLD), two of them, so a compaction under load is
# followed by another burst on the compacted log; a third was the same again (~17 s), and
# the long run (make chaos) keeps ten.
SHORT_WRITES = 20_000
SHORT_BURSTS = 2
WORKERS = 2
THREADS = 8
EXCEPTION_LOOP = re.compile(r"failed _onTick|IndexError|Traceback")
DIVERGENCE = re.compile(r"^.*(?:truncating already-applied|may have diverged).*$", re.MULTILINE)
# Raft entries between snapshots: at ~5 writes an entry, a short burst (10,000 writes) is
# about 2,000 entries, so every server compacts at least once a burst.
SNAPSHOT_THRESHOLD = 1_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three real servers that compact their logs often (see SNAPSHOT_THRESHOLD)."""
    args = ("-raft-snapshot-threshold", str(SNAPSHOT_THRESHOLD))
    with LocalCluster(tmp_path / "cluster", servers=3, extra_args=args) as c:
        wait_settled(c)
        yield c


def registered_versions(addresses: list[str]) -> int:
    """How many registrations the state holds: every stress job's version counts its own
    (each write changes the job, so each acknowledged write is one more version)."""
    with DroverClient(addresses) as client:
        return sum(client.get_job(f"stress-{n:03d}").job.version + 1 for n in range(JOB_IDS))


@pytest.mark.parametrize(
    ("total_writes", "bursts"),
    [
        pytest.param(SHORT_WRITES, SHORT_BURSTS, id="short"),
        pytest.param(TOTAL_WRITES, BURSTS, id="long", marks=pytest.mark.chaos),
    ],
)
def test_raft_stress__bursts_of_writes__replicas_converge_without_exception_loops(
    cluster: LocalCluster, total_writes: int, bursts: int
) -> None:
    per_burst = total_writes // bursts
    addresses = [cluster.grpc_addresses[cluster.leader_index()]]
    acked = 0
    started = time.monotonic()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=ctx) as pool:
        for burst in range(bursts):
            futures = [
                pool.submit(write_burst, addresses, w, per_burst // WORKERS, THREADS, burst)
                for w in range(WORKERS)
            ]
            acked += sum(f.result(timeout=600) for f in futures)
            digest, index = cluster.wait_converged(timeout=120)
    elapsed = time.monotonic() - started

    assert acked == total_writes
    digests = cluster.digests()
    assert len(digests) == 3 and len(set(digests.values())) == 1, digests
    # Every acknowledged write applied exactly once (a raft entry can carry several).
    assert registered_versions(addresses) == total_writes
    assert index >= total_writes // (THREADS * WORKERS)
    for i in range(3):
        log = cluster.log(i)
        loops = EXCEPTION_LOOP.findall(log)
        assert not loops, f"{cluster.server_names[i]} logged {len(loops)} exception lines:\n{log[-3000:]}"
    compactions = sum(cluster.log(i).count("raft.snapshot_written") for i in range(3))
    truncations = {name: DIVERGENCE.findall(cluster.log(i)) for i, name in enumerate(cluster.server_names)}
    print(
        f"\nstress: {acked} writes in {elapsed:.1f}s ({acked / elapsed:.0f}/s), final index {index}, "
        f"digest {digest[:12]}, compactions {compactions}, "
        f"follower truncations {sum(len(lines) for lines in truncations.values())}"
    )
    assert compactions >= 3, "log compaction must have run during the stress test"
    diverged = [f"{name}: {line.strip()[:300]}" for name, lines in truncations.items() for line in lines]
    assert not diverged, "a follower truncated entries it had already applied:\n" + "\n".join(diverged[:10])
