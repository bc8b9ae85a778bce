"""Heartbeat timers: the leader's record of when each client must be heard from next.

Leader only, driven by ``expired(now)`` from the leader's ticker (no timer threads). The TTL
a client is told scales with the cluster so the leader sees at most
``max_heartbeats_per_second`` heartbeats (Nomad's RateScaledInterval), plus a random
stagger so clients spread out; the server waits ``ttl + grace`` before acting. A new leader
gives every live node ``failover_ttl`` (no grace) before judging anyone: a leader change
must never mark healthy clients down.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Final

from drover.server.telemetry.metrics import HEARTBEAT_INVALIDATIONS, HEARTBEAT_TTL_SECONDS

SECOND: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    min_ttl_ns: int = 10 * SECOND
    max_per_second: float = 50.0
    grace_ns: int = 10 * SECOND
    failover_ttl_ns: int = 300 * SECOND


class HeartbeatTimers:
    def __init__(self, config: HeartbeatConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._deadlines: dict[str, int] = {}
        self._enabled = False

    def set_enabled(self, enabled: bool) -> None:
        with self._lock:
            self._enabled = enabled
            self._deadlines.clear()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def _base_ttl_ns(self, nodes: int) -> int:
        if self.config.max_per_second <= 1 / 86400:
            return self.config.min_ttl_ns
        return max(self.config.min_ttl_ns, int(nodes / self.config.max_per_second * SECOND))

    def reset(self, node_id: str, now_ns: int) -> int:
        """Arm the node's timer; returns the TTL to tell the client."""
        with self._lock:
            base = self._base_ttl_ns(len(self._deadlines) + (0 if node_id in self._deadlines else 1))
            ttl = base + int(self._rng.random() * base)
            if self._enabled:
                self._deadlines[node_id] = now_ns + ttl + self.config.grace_ns
        HEARTBEAT_TTL_SECONDS.observe(ttl / SECOND)
        return ttl

    def heard_from(self, node_id: str, now_ns: int) -> None:
        """A call from a tracked node that proves it alive but answers (and re-arms its timer)
        only once its raft write commits: a Register, a status change. Its timer is pushed
        to at least one base TTL plus the grace from now, so it can not run out while that
        call waits for its commit. Under a 4,000-client registration burst a Register took
        up to 10 s to commit, and nodes were marked down with their Register in flight.
        An untracked node (a first registration) gets no timer here: should the write fail,
        the reaper would judge a node that does not exist."""
        with self._lock:
            if not self._enabled or node_id not in self._deadlines:
                return
            hold = now_ns + self._base_ttl_ns(len(self._deadlines)) + self.config.grace_ns
            self._deadlines[node_id] = max(self._deadlines[node_id], hold)

    def initialize(self, node_ids: list[str], now_ns: int) -> None:
        """On leadership: every live node gets the failover TTL."""
        with self._lock:
            for node_id in node_ids:
                self._deadlines[node_id] = now_ns + self.config.failover_ttl_ns

    def remove(self, node_id: str) -> None:
        with self._lock:
            self._deadlines.pop(node_id, None)

    def expired(self, now_ns: int) -> list[str]:
        """Nodes whose timer ran out (their timers are removed)."""
        with self._lock:
            if not self._enabled:
                return []
            gone = sorted(n for n, deadline in self._deadlines.items() if deadline <= now_ns)
            for node_id in gone:
                del self._deadlines[node_id]
        if gone:
            HEARTBEAT_INVALIDATIONS.inc(len(gone))
        return gone

    def tracked(self) -> int:
        with self._lock:
            return len(self._deadlines)
