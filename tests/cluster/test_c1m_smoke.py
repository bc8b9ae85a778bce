"""The C1M bench (tests/bench/c1m.py) at a tiny size, so it keeps working: 50 simulated
nodes on the real client protocol, 4 service jobs of 10 and one system job registered at
once on three real servers, then the snapshot, a follower's restart and one leader
failover, every figure present and sane. ``make bench`` runs the same at 5,000 nodes and
200,000 allocs.
"""

from __future__ import annotations

from tests.bench.c1m import FAILOVER_TIMEOUT_S, C1MConfig, run_c1m


def test_c1m__tiny_fleet__every_alloc_placed_snapshot_catch_up_and_failover_measured() -> None:
    cfg = C1MConfig(nodes=50, service_jobs=4, count=10, system_jobs=1, processes=1, failovers=1, settle_s=1.0)
    doc = run_c1m(cfg)
    results = doc["results"]
    assert doc["errors"] == [], results.get("traceback", results)

    placement = results["placement"]
    assert placement["complete"], placement
    assert placement["placed"] == cfg.expected_allocs() == 90
    assert placement["placements_per_s"] > 0
    assert results["register"]["errors"] == 0, results["register"]
    assert results["leader_rss"]["peak_mb"] >= results["leader_rss"]["baseline_mb"] > 0

    snapshot = results["snapshot"]
    assert snapshot["allocs"] == 90, snapshot
    assert snapshot["raft_file_bytes"] > 0 and snapshot["raft_file_write_s"] > 0

    catch_up = results["follower_catch_up"]
    assert catch_up["target_index"] > 0
    assert 0 < catch_up["answering_s"] <= catch_up["caught_up_s"]

    (failover,) = results["failovers"]
    assert failover["new_leader"] != failover["killed"]
    assert 0 < failover["write_accepted_s"] < FAILOVER_TIMEOUT_S
    assert failover["restart"]["caught_up_s"] > 0
    assert results["nodes_not_ready_at_end"] == 0
