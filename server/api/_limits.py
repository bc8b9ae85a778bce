"""What one caller may hold and spend on a server: parked blocking queries, and the rate of
its expensive calls. Beyond either, RESOURCE_EXHAUSTED ("... retry later"), before any work.

Why. A parked blocking query no longer holds a thread (the API serves on grpc.aio and
waits on the event loop: server/api/_aio.py), but each still costs memory and a check on
every change of its tables, so one caller must not hold them without bound. And a few
RPCs cost far more than they take to send (``Jobs.Plan`` runs the scheduler on a copy of
the state; ``Operator.SnapshotSave`` and ``StateDigest`` serialise the whole state), so a
loop of them starves everyone else.

Who is a caller. The peer's host (its IP address, without the port: reconnecting does not
make a new caller; Nomad's per-IP limits work the same way). A follower forwarding a call
to the leader names the original caller in metadata (``x-drover-caller``); the leader
believes that name only when the forwarding peer's host is one of the servers' own hosts
(the ``servers`` table), so a client can not hide behind a made-up name from elsewhere.
A node's own alloc watch (``GetClientAllocs``, ``WatchClientAllocs``), once the node's
secret is checked, parks as the node (server/api/_park.py ``node_caller``): thousands of
nodes may share one address.

The numbers:

* parked blocking queries (a read with ``options.min_index > 0``, every
  ``WatchClientAllocs`` and ``Events.Stream`` stream): at most ``MAX_PARKED_PER_CALLER``
  per caller and ``MAX_PARKED_TOTAL`` for the whole server (a fleet of 10,000 nodes, each
  with its watch, and room for operators' queries);
* expensive RPCs: a token bucket per (caller, ``RATE_LIMITS`` entry): ``burst`` calls at
  once, refilled at ``per_second``.

The buckets and counters are plain values stepped with the time passed in
(``TokenBucket.take(now)``); ``CallerLimits`` is the thin locked shell the servicers use.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import grpc
import structlog

from drover.server.api._park import current_parking
from drover.server.errors import ResourceExhaustedError

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = [
    "CALLER_CHECK_S",
    "CALLER_METADATA_KEY",
    "MAX_PARKED_PER_CALLER",
    "MAX_PARKED_TOTAL",
    "RATE_LIMITS",
    "CallerLimits",
    "Rate",
    "TokenBucket",
    "caller_limits",
    "caller_waiting",
    "current_caller",
    "is_blocking",
    "peer_host",
]

log = structlog.get_logger("drover.api")

CALLER_METADATA_KEY: Final = "x-drover-caller"
FORWARDED_KEY: Final = "x-drover-forwarded"
MAX_PARKED_PER_CALLER: Final = 64
MAX_PARKED_TOTAL: Final = 12_000
# Buckets of callers gone quiet are dropped once this many are tracked.
MAX_TRACKED_BUCKETS: Final = 4096


@dataclass(frozen=True, slots=True)
class Rate:
    bucket: str
    per_second: float
    burst: int


# RPCs whose one call costs much more than it takes to send. Register and Dispatch share a
# bucket sized far above any deploy script, so only a flood (a raft entry and a state
# copy per call) meets it.
RATE_LIMITS: Final[dict[str, Rate]] = {
    "Jobs.Plan": Rate("plan", 20.0, 100),
    "Jobs.Register": Rate("job-register", 1000.0, 5000),
    "Jobs.Dispatch": Rate("job-register", 1000.0, 5000),
    "Operator.SnapshotSave": Rate("snapshot-save", 5.0, 20),
    "Operator.SnapshotRestore": Rate("snapshot-restore", 1.0, 5),
    "Operator.StateDigest": Rate("state-digest", 50.0, 200),
    "Operator.Invariants": Rate("invariants", 20.0, 100),
    "Operator.ReconcileSummaries": Rate("reconcile-summaries", 5.0, 20),
    "Operator.GarbageCollect": Rate("system-gc", 1.0, 10),
}


@dataclass(slots=True)
class TokenBucket:
    """``burst`` tokens, refilled at ``per_second``; a call takes one."""

    per_second: float
    burst: int
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: Rate, now: float) -> TokenBucket:
        return cls(rate.per_second, rate.burst, float(rate.burst), now)

    def take(self, now: float) -> bool:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.updated) * self.per_second)
        self.updated = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def is_full(self, now: float) -> bool:
        return self.tokens + max(0.0, now - self.updated) * self.per_second >= self.burst


def peer_host(peer: str) -> str:
    """``ipv4:10.0.0.5:51234`` -> ``10.0.0.5``; ``ipv6:[::1]:5`` -> ``::1``; others as given."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] or rest
        return host.strip("[]")
    return kind if kind in ("unix", "unix-abstract") else peer


def _address_host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("drover_caller", default="")
_CONTEXT: contextvars.ContextVar[grpc.ServicerContext | None] = contextvars.ContextVar(
    "drover_rpc_context", default=None
)
# How often a parked query looks whether its caller is still there.
CALLER_CHECK_S: Final = 1.0


def current_caller() -> str:
    """The caller of the RPC this thread is serving ("" outside one): forwarded with it."""
    return _CALLER.get()


def caller_waiting() -> bool:
    """False once the caller of the RPC this thread serves has gone (cancelled, timed
    out, disconnected): a parked query then gives its thread and parking place back
    instead of holding them to the end of its wait."""
    context = _CONTEXT.get()
    return context is None or bool(context.is_active())


class CallerLimits:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._parked: dict[str, int] = {}
        self._parked_total = 0

    # -- who ---------------------------------------------------------------------------

    def caller(self, core: ServerCore | None, context: grpc.ServicerContext) -> str:
        host = peer_host(context.peer() or "")
        metadata = dict(context.invocation_metadata() or ())
        named = metadata.get(CALLER_METADATA_KEY)
        if core is None or FORWARDED_KEY not in metadata or not isinstance(named, str) or not named:
            return host
        servers = {_address_host(m.grpc_address) for m in core.store.snapshot().servers()}
        return named if host in servers else host

    # -- rate ----------------------------------------------------------------------------

    def take(self, rpc_name: str, caller: str) -> None:
        rate = RATE_LIMITS.get(rpc_name)
        if rate is None:
            return
        now = self._clock()
        with self._lock:
            key = (caller, rate.bucket)
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= MAX_TRACKED_BUCKETS:
                    self._buckets = {k: b for k, b in self._buckets.items() if not b.is_full(now)}
                bucket = self._buckets[key] = TokenBucket.full(rate, now)
            allowed = bucket.take(now)
        if not allowed:
            raise ResourceExhaustedError(
                f"rate limited: {rpc_name} allows {rate.burst} calls at once and {rate.per_second:g}/s "
                f"after that per caller ({caller}); retry later"
            )

    # -- parked queries --------------------------------------------------------------------

    def acquire(self, caller: str) -> None:
        """Take one parking place for ``caller``, or refuse (ResourceExhaustedError)."""
        with self._lock:
            mine = self._parked.get(caller, 0)
            if mine >= MAX_PARKED_PER_CALLER:
                why = f"{caller} has {mine} blocking queries waiting (at most {MAX_PARKED_PER_CALLER})"
            elif self._parked_total >= MAX_PARKED_TOTAL:
                why = f"this server has {self._parked_total} blocking queries waiting (at most {MAX_PARKED_TOTAL})"
            else:
                why = ""
                self._parked[caller] = mine + 1
                self._parked_total += 1
        if why:
            raise ResourceExhaustedError(f"too many blocking queries: {why}; retry later")

    def release(self, caller: str) -> None:
        with self._lock:
            left = self._parked[caller] - 1
            if left:
                self._parked[caller] = left
            else:
                del self._parked[caller]
            self._parked_total -= 1

    @contextlib.contextmanager
    def parked(self, caller: str) -> Iterator[None]:
        """Hold one parking place for ``caller`` while the body waits."""
        self.acquire(caller)
        try:
            yield
        finally:
            self.release(caller)

    def parked_total(self) -> int:
        with self._lock:
            return self._parked_total

    # -- the one entry point of the rpc decorator ----------------------------------------

    def admit(
        self,
        core: ServerCore,
        rpc_name: str,
        request: Any,
        context: grpc.ServicerContext,
        call: Callable[[], Any],
    ) -> Any:
        """Run ``call`` for this caller, within its rate and parking limits."""
        caller = self.caller(core, context)
        token = _CALLER.set(caller)
        context_token = _CONTEXT.set(context)
        try:
            parking = current_parking()
            # One token per call: under the aio bridge a read runs again after its
            # confirmation round and after each wake of its wait (server/api/_park.py).
            if parking is None or parking.runs <= 1:
                self.take(rpc_name, caller)
            # Under the aio bridge a blocking query parks on the loop, and the bridge holds
            # its place then (server/api/_park.py); here it would wait in this thread.
            if not _is_blocking(request) or current_parking() is not None:
                return call()
            with self.parked(caller):
                return call()
        finally:
            _CONTEXT.reset(context_token)
            _CALLER.reset(token)


def is_blocking(request: Any) -> bool:
    """A read that waits for ``options.min_index`` to pass."""
    return _is_blocking(request)


def _is_blocking(request: Any) -> bool:
    fields = request.DESCRIPTOR.fields_by_name
    return "options" in fields and request.HasField("options") and request.options.min_index > 0


_BY_CORE: weakref.WeakKeyDictionary[Any, CallerLimits] = weakref.WeakKeyDictionary()
_BY_CORE_LOCK: Final = threading.Lock()


def caller_limits(core: ServerCore) -> CallerLimits:
    """The limits of ``core``'s gRPC server (made on first use, one per server)."""
    with _BY_CORE_LOCK:
        limits = _BY_CORE.get(core)
        if limits is None:
            limits = _BY_CORE[core] = CallerLimits()
        return limits
