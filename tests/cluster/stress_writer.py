"""A load process for the raft stress test: registers periodic jobs as fast as it can.

Runs in its own process (spawned, not forked: the test process has grpc threads) so the
load generator's GIL is not the test's.
"""

from __future__ import annotations

import threading

from drover.sdk import DroverClient
from tests.cluster.jobs import periodic_job

JOB_IDS = 500
# Bounds the workers of one burst, so the sequence numbers of two bursts never meet.
WORKERS_PER_BURST = 64


def write_burst(addresses: list[str], worker: int, writes: int, threads: int, burst: int = 0) -> int:
    """Register ``writes`` job versions over ``threads`` threads; returns how many were acked.
    Every write of every ``burst`` and ``worker`` carries its own sequence number, so each
    one changes its job and the state's versions count the writes applied."""
    acked = [0] * threads

    def run(t: int) -> None:
        with DroverClient(addresses, retry_deadline=60) as client:
            for n in range(writes // threads):
                seq = ((burst * WORKERS_PER_BURST + worker) * threads + t) * writes + n
                client.register_job(periodic_job(f"stress-{seq % JOB_IDS:03d}", seq=str(seq)))
                acked[t] += 1

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(acked)
