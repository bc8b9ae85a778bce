"""The fleet simulator (tests/bench/fleet.py) at a small size, so it keeps working: 200
clients on the real client protocol against three servers for 30 s, the leader killed at
12 s. Every client must be held (no false down), and every one must be back on the new
leader (a heartbeat or re-registration accepted after the kill) well within the failover
TTL, with its tunnel open again; ``make bench`` runs the same at 5,000 clients for 10
minutes.
"""

from __future__ import annotations

from tests.bench.fleet import FAILOVER_TTL_S, FleetConfig, run_fleet


def test_fleet__200_clients_through_a_leader_failover__none_down_all_back() -> None:
    cfg = FleetConfig.make(quick=True)
    doc = run_fleet(cfg)
    results = doc["results"]
    assert doc["errors"] == [], results.get("traceback", results)
    assert results["false_downs"]["count"] == 0, results["false_downs"]
    back = results["back_after_failover"]
    assert back["clients_missing"] == 0, back
    assert back["slowest_s"] < FAILOVER_TTL_S, back
    assert results["non_ready_at_end"] == 0
    assert results["tunnels_open_at_end"] == cfg.clients
    # The window measured something on both sides of the kill.
    assert results["heartbeats"]["before_failover"]["calls"] > 0
    assert results["heartbeats"]["after_failover"]["calls"] > 0
    assert results["job_status_read"]["calls"] > 0
    # The breakdown of a heartbeat's time read the leader's histogram and the sims' loops.
    breakdown = results["before_failover_breakdown"]
    assert breakdown["leader_heartbeat_served_ms"]["count"] > 0, breakdown
    assert breakdown["leader_api_loop_lag_ms"]["count"] > 0, breakdown
    assert breakdown["sim_loop_lag_ms"]["max"] > 0, breakdown
    assert {"s1", "s2", "s3", "sim0"} <= breakdown["cpu_percent_of_a_core"].keys(), breakdown
