"""Coroutines on the API loop waiting for what another thread writes.

The raft thread acks a leadership round (server/raft/read_confirm.py) and the apply thread
publishes events (server/events/buffer.py); a coroutine can not wait on their
``threading.Condition``. Each waiter registers an ``asyncio.Event`` under the owner's
lock, and the writer, still under that lock, wakes every one on its own loop
(``call_soon_threadsafe``). A waiter clears its event before it looks at the state, so a
write landing between its look and its wait sets the event again and nothing is missed.

Not locked itself: its owner calls it under the lock that guards what is waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence

__all__ = ["LoopWakers", "woken_within"]


class LoopWakers:
    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, set[asyncio.Event]] = {}

    def __len__(self) -> int:
        """How many coroutines wait (0 once every one has left)."""
        return sum(len(events) for events in self._by_loop.values())

    @contextlib.contextmanager
    def waiting(self, lock: threading.Lock | threading.Condition) -> Iterator[asyncio.Event]:
        """An event for the calling coroutine, set by every ``wake_all`` while it is held."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with lock:
            self._by_loop.setdefault(loop, set()).add(event)
        try:
            yield event
        finally:
            with lock:
                events = self._by_loop.get(loop)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._by_loop[loop]

    def wake_all(self) -> None:
        """Set every waiter's event, on its loop; call under the owner's lock."""
        for loop, events in self._by_loop.items():
            try:
                loop.call_soon_threadsafe(_set_all, tuple(events))
            except RuntimeError:
                pass  # that loop is closed (the server is stopping): nobody waits on it


async def woken_within(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set or ``timeout`` seconds have passed, whichever is first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def _set_all(events: Sequence[asyncio.Event]) -> None:
    for event in events:
        event.set()
