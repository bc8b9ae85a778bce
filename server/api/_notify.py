"""The state store's commits, seen from the API's event loop.

The store is written by the raft apply thread and signals a ``threading.Condition``; a
coroutine can not wait on that. ``IndexNotifier`` keeps one thread waiting on the store for
the next index and hands each change to the loop with ``call_soon_threadsafe`` (changes
that arrive while one is pending are coalesced into it: a waiter always re-reads the
newest snapshot, so it never misses one). On the loop, waiters are kept by table, and a
change wakes only the waiters of tables whose index moved and whose condition now holds:
``_wake`` checks each one's ``ready`` itself, so a waiter with nothing new is not resumed
(a coroutine run, a new future and a new timer each). So ten thousand parked watches cost
memory and a predicate call each when their table changes, not a thread each. Resuming
every one was what every alloc change cost: when a 4,000-client fleet's 100 allocs were
placed and reported running, each change resumed all 4,000 parked node watches, and for
the next 15 s or so every heartbeat timed out.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from drover.server.state_store import Snapshot

if TYPE_CHECKING:
    from drover.server.core import ServerCore
    from drover.server.state_store import StateStore

__all__ = ["IndexNotifier", "attach_notifier", "notifier_for"]

# The key of waiters on no table in particular: woken by any new index.
_ANY: Final = ""
# How often the watching thread looks again without a change (a restore may lower the index).
_RECHECK_S: Final = 1.0


class IndexNotifier:
    def __init__(self, store: StateStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop
        # Only touched on the loop thread: each table's waiters, with what they wait for.
        self._waiters: dict[str, dict[asyncio.Future[None], Callable[[Snapshot], bool]]] = {}
        self._seen: dict[str, int] = {}
        self._pending = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="api-index-notifier", daemon=True)
        self._thread.start()

    # -- the store's side (its own thread) ---------------------------------------------------

    def _watch(self) -> None:
        seen = self._store.index
        while not self._stopped.is_set():
            closed = self._store.closed
            changed = self._store.wait_for_index(seen + 1, _RECHECK_S) or self._store.index != seen
            if changed or closed:
                seen = self._store.index
                self._signal()
            if closed:
                return

    def _signal(self) -> None:
        if self._pending:
            return
        self._pending = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    def stop(self) -> None:
        self._stopped.set()
        self._signal()

    # -- the loop's side -------------------------------------------------------------------

    def _wake(self) -> None:
        self._pending = False
        snap = self._store.snapshot()
        everything = self._store.closed or self._stopped.is_set()
        for table, waiters in list(self._waiters.items()):
            index = snap.index if table == _ANY else snap.table_index(table)
            if not everything and index == self._seen.get(table):
                continue
            self._seen[table] = index
            still: dict[asyncio.Future[None], Callable[[Snapshot], bool]] = {}
            for waiter, ready in waiters.items():
                if waiter.done():
                    continue
                if everything or _holds(ready, snap):
                    waiter.set_result(None)
                else:
                    still[waiter] = ready
            self._waiters[table] = still

    async def wait_until(
        self, tables: tuple[str, ...], ready: Callable[[Snapshot], bool], deadline: float
    ) -> Snapshot:
        """The first snapshot for which ``ready`` holds, or the current one at ``deadline``
        (monotonic) or once the store closes. Cancelling the caller's task ends the wait."""
        names = tables or (_ANY,)
        while True:
            snap = self._store.snapshot()
            remaining = deadline - time.monotonic()
            if ready(snap) or remaining <= 0 or self._store.closed or self._stopped.is_set():
                return snap
            waiter: asyncio.Future[None] = self._loop.create_future()
            for name in names:
                self._seen.setdefault(name, snap.index if name == _ANY else snap.table_index(name))
                self._waiters.setdefault(name, {})[waiter] = ready
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                pass
            finally:
                for name in names:
                    self._waiters.get(name, {}).pop(waiter, None)


def _holds(ready: Callable[[Snapshot], bool], snap: Snapshot) -> bool:
    """``ready(snap)``; a condition that raises wakes its waiter, whose own check then
    raises in its handler, where it is answered."""
    try:
        return ready(snap)
    except Exception:
        return True


_BY_CORE: weakref.WeakKeyDictionary[Any, IndexNotifier] = weakref.WeakKeyDictionary()


def attach_notifier(core: ServerCore, notifier: IndexNotifier) -> None:
    """Made by the server's assembly (server/api/grpc_server.py), on its loop."""
    _BY_CORE[core] = notifier


def notifier_for(core: ServerCore) -> IndexNotifier:
    """The notifier of ``core``'s API loop; only async handlers (on that loop) ask."""
    return _BY_CORE[core]
