"""Raft under stress: 100,000 writes in bursts on 3 real servers (docs/design.md, pysyncobj defects).

Every replica must reach the same applied index and state digest after every burst, no
server may log an exception loop (pysyncobj's "failed _onTick" / IndexError after a follower's
log was emptied), and no follower may truncate entries it had already applied (pysyncobj's
"truncating already-applied log entries ... may have diverged", the defect
server/raft/append.py exists to prevent). Log compaction runs several times during the test
(every 20,000 entries). The write rate is printed, not asserted: it is a benchmark figure.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from deploy.cluster import LocalCluster
from tests.cluster.stress_writer import write_burst

TOTAL_WRITES = int(os.environ.get("DROVER_STRESS_WRITES", "100000"))
BURSTS = 10
# make test's bounded run: past one compaction on every server (20,000 entries), so the
# compaction-under-load defects it targets still show, in under a third of the writes.
SHORT_WRITES = 30_000
SHORT_BURSTS = 3
WORKERS = 2
THREADS = 8
EXCEPTION_LOOP = re.compile(r"failed _onTick|IndexError|Traceback")
DIVERGENCE = re.compile(r"^.*(?:truncating already-applied|may have diverged).*$", re.MULTILINE)


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
        for _burst in range(bursts):
            futures = [
                pool.submit(write_burst, addresses, w, per_burst // WORKERS, THREADS) for w in range(WORKERS)
            ]
            acked += sum(f.result(timeout=600) for f in futures)
            digest, index = cluster.wait_converged(timeout=120)
    elapsed = time.monotonic() - started

    assert acked == total_writes
    digests = cluster.digests()
    assert len(digests) == 3 and len(set(digests.values())) == 1, digests
    assert index >= total_writes
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
