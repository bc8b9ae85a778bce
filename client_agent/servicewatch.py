"""One watch of service registrations per agent, fanned out to the allocs whose templates read them.

Why one. A blocking query parks on a server, and a server parks at most 64 per caller
(server/api/_limits.py): with one watch per templated alloc, a node past ~60 of them saw
its later watches refused and fell back to polling. A node holds one watch instead, and
every alloc's templates hear from it.

How. The servers index the registrations table as a whole (``Services.ClientInfo``
returns the table's index, and a call with ``min_index`` returns once *any* registration
moved), so one blocking call is enough to learn that something changed, whichever
namespace it was in. Each round:

1. ``plan_reads`` groups the names every subscribed alloc reads by namespace (a call reads
   one namespace: its alloc's), and picks for each namespace an alloc of that namespace to
   ask as (the server checks that the alloc is on this node).
2. The first read blocks, with ``min_index`` the oldest index any cached name was read at:
   a name a template looked up at an older index than the others (just added) is read again
   at once instead of waiting for the next change.
3. Every other namespace is read at once, at that answer's index or later.
4. ``changed_subscribers`` says which allocs read a name whose registrations differ from
   before; each gets its ``on_change`` (the alloc runner re-renders), on this thread.

``AllocServices`` is one alloc's handle, with the interface the alloc runner used of its
own per-alloc watch: ``lookup(name)`` (a template's ``nomadService``: the first ask for a
name reads it at once, since a task's first render must see the services already
registered), ``watch(on_change)`` and ``stop()`` (unsubscribe).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drover.client.errors import ClientAgentError
from drover.client.services import registration_view
from drover.client.threads import join_thread
from drover.v1 import structs_pb2

__all__ = [
    "AgentFetch",
    "AllocServices",
    "Read",
    "ServiceWatch",
    "Subscriber",
    "changed_subscribers",
    "plan_reads",
]

# (alloc ID to ask as, service names, min_index, wait seconds, cancel flag) -> (registrations, index)
AgentFetch = Callable[
    [str, Sequence[str], int, float, threading.Event | None],
    tuple[Sequence[structs_pb2.ServiceRegistration], int],
]
# A cached name: (namespace, service name).
Key = tuple[str, str]
View = list[dict[str, Any]]

WATCH_WAIT_S: Final = 30.0
RETRY_S: Final = 1.0
# How long the thread sleeps when no alloc reads any service (a subscription wakes it).
IDLE_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class Subscriber:
    """What one alloc reads: its namespace and the service names its templates asked for."""

    alloc_id: str
    namespace: str
    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class Read:
    """One call of a round: ``names`` of ``namespace``, asked as ``alloc_id``."""

    alloc_id: str
    namespace: str
    names: tuple[str, ...]


def plan_reads(subscribers: Iterable[Subscriber], attempt: int = 0) -> tuple[Read, ...]:
    """One read per namespace that some alloc reads a name of, namespaces in sorted order.
    The alloc asked as is one of that namespace's, rotated by ``attempt`` (the failures so
    far), so an alloc the servers no longer know does not block the namespace's reads."""
    names: dict[str, set[str]] = {}
    allocs: dict[str, list[str]] = {}
    for sub in subscribers:
        if not sub.names:
            continue
        names.setdefault(sub.namespace, set()).update(sub.names)
        allocs.setdefault(sub.namespace, []).append(sub.alloc_id)
    reads = []
    for namespace in sorted(names):
        candidates = sorted(allocs[namespace])
        reads.append(Read(candidates[attempt % len(candidates)], namespace, tuple(sorted(names[namespace]))))
    return tuple(reads)


def changed_subscribers(
    before: Mapping[Key, View], after: Mapping[Key, View], subscribers: Iterable[Subscriber]
) -> tuple[str, ...]:
    """The allocs (sorted) that read a name whose registrations differ between ``before``
    and ``after``; a name absent from ``after`` was not read this round and did not change."""
    changed = {key for key, views in after.items() if before.get(key) != views}
    return tuple(
        sorted(
            sub.alloc_id for sub in subscribers if any((sub.namespace, name) in changed for name in sub.names)
        )
    )


def group_views(
    namespace: str, names: Iterable[str], regs: Iterable[structs_pb2.ServiceRegistration]
) -> dict[Key, View]:
    """A read's answer by name: every name asked for, with no registrations when none came."""
    grouped: dict[Key, View] = {(namespace, name): [] for name in names}
    for reg in regs:
        key = (namespace, reg.service_name)
        if key in grouped:
            grouped[key].append(registration_view(reg))
    return grouped


class _Subscription:
    def __init__(self, alloc_id: str, namespace: str) -> None:
        self.alloc_id = alloc_id
        self.namespace = namespace
        self.names: set[str] = set()
        self.on_change: Callable[[], None] | None = None


class ServiceWatch:
    """The agent's one watch (see the module docstring); ``start()``/``stop()`` with the agent."""

    def __init__(self, fetch: AgentFetch, *, log: Any) -> None:
        self._fetch = fetch
        self._log = log
        self._lock = threading.Lock()
        self._subs: dict[str, _Subscription] = {}
        self._views: dict[Key, View] = {}
        # The index each cached name was last read at (0: its read failed).
        self._read_at: dict[Key, int] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        # The round in flight: its cancel flag and the min_index its blocking read waits past.
        self._round_cancel = threading.Event()
        self._round_min_index = 0

    def subscribe(self, alloc_id: str, namespace: str) -> AllocServices:
        with self._lock:
            sub = self._subs.setdefault(alloc_id, _Subscription(alloc_id, namespace))
        return AllocServices(self, sub)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="services-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._round_cancel.set()

    def join(self, timeout_s: float) -> bool:
        self.stop()
        return self._thread is None or join_thread(self._thread, timeout_s)

    def subscribers(self) -> tuple[Subscriber, ...]:
        with self._lock:
            return self._subscribers_locked()

    # -- what AllocServices calls ------------------------------------------------------

    def _lookup(self, sub: _Subscription, name: str) -> Sequence[Mapping[str, Any]]:
        key = (sub.namespace, name)
        with self._lock:
            sub.names.add(name)
            known = self._views.get(key)
        if known is not None:
            return known
        try:
            registrations, index = self._fetch(sub.alloc_id, [name], 0, 0.0, None)
        except ClientAgentError as exc:
            # Rendered as no registrations now; the watch reads it again at once.
            self._log.warning("services.lookup_failed", service=name, error=str(exc))
            registrations, index = (), 0
        views = group_views(sub.namespace, [name], registrations)[key]
        with self._lock:
            self._views.setdefault(key, views)
            self._read_at.setdefault(key, index)
            answer = self._views[key]
            if self._read_at[key] < self._round_min_index:
                # Read older than what the round in flight waits past (a failed read, a
                # lagging server): a change in between would be missed, so start over now.
                self._round_cancel.set()
        self._wake.set()
        return answer

    def _unsubscribe(self, sub: _Subscription) -> None:
        with self._lock:
            if self._subs.get(sub.alloc_id) is sub:
                del self._subs[sub.alloc_id]
            read = {(s.namespace, n) for s in self._subs.values() for n in s.names}
            for key in [k for k in self._views if k not in read]:
                del self._views[key]
                self._read_at.pop(key, None)

    # -- the thread --------------------------------------------------------------------

    def _subscribers_locked(self) -> tuple[Subscriber, ...]:
        return tuple(Subscriber(s.alloc_id, s.namespace, frozenset(s.names)) for s in self._subs.values())

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                subscribers = self._subscribers_locked()
                reads = plan_reads(subscribers, self._failures)
                oldest = min(
                    (self._read_at.get((r.namespace, n), 0) for r in reads for n in r.names), default=0
                )
                cancel = self._round_cancel = threading.Event()
                self._round_min_index = max(oldest, 1)
            if self._stop.is_set():
                return
            if not reads:
                self._wake.wait(IDLE_S)
                self._wake.clear()
                continue
            try:
                after = self._read_round(reads, max(oldest, 1), cancel)
            except ClientAgentError as exc:
                if self._stop.is_set():
                    return
                if cancel.is_set():
                    continue  # interrupted by a lookup: read again at once
                self._failures += 1
                self._log.info("services.watch_retry", error=str(exc))
                self._stop.wait(RETRY_S)
                continue
            if self._stop.is_set():
                return
            self._failures = 0
            self._fan_out(after)

    def _read_round(
        self, reads: Sequence[Read], min_index: int, cancel: threading.Event
    ) -> dict[Key, tuple[View, int]]:
        first, *others = reads
        regs, index = self._fetch(first.alloc_id, first.names, min_index, WATCH_WAIT_S, cancel)
        answers = {k: (v, index) for k, v in group_views(first.namespace, first.names, regs).items()}
        for read in others:
            if self._stop.is_set():
                break
            # At the first answer's index or later: returns at once on a server that has it.
            regs, at = self._fetch(read.alloc_id, read.names, max(index - 1, 0), WATCH_WAIT_S, cancel)
            answers |= {k: (v, at) for k, v in group_views(read.namespace, read.names, regs).items()}
        return answers

    def _fan_out(self, answers: Mapping[Key, tuple[View, int]]) -> None:
        with self._lock:
            before = dict(self._views)
            # Only names some alloc still reads: one that unsubscribed meanwhile is dropped.
            read = {(s.namespace, n) for s in self._subs.values() for n in s.names}
            after = {key: views for key, (views, _) in answers.items() if key in read}
            for key, (_, index) in answers.items():
                if key in read:
                    self._read_at[key] = max(self._read_at.get(key, 0), index)
            self._views.update(after)
            notify = changed_subscribers(before, after, self._subscribers_locked())
            callbacks = [cb for alloc_id in notify if (cb := self._subs[alloc_id].on_change) is not None]
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:  # one alloc's failed re-render must not end the watch
                self._log.error("services.rerender_failed", error=str(exc))


class AllocServices:
    """One alloc's subscription to the agent's watch."""

    def __init__(self, watch: ServiceWatch, sub: _Subscription) -> None:
        self._watch = watch
        self._sub = sub

    def lookup(self, name: str) -> Sequence[Mapping[str, Any]]:
        return self._watch._lookup(self._sub, name)

    def watch(self, on_change: Callable[[], None]) -> None:
        self._sub.on_change = on_change

    def stop(self) -> None:
        self._sub.on_change = None
        self._watch._unsubscribe(self._sub)

    def join(self, timeout_s: float) -> bool:
        """Nothing of the alloc's own to wait for: the thread is the agent's."""
        return True
