"""Sync write handlers run on the API loop itself, waiting for their commit without a thread.

Theory of operation
-------------------
A write RPC's handler is sync code (validate, build the entry, ``RaftNode.propose``, build
the answer) whose only wait is the commit. Run in a pool thread (server/api/_aio.py), each
write paid two thread hand-offs on top of its work: loop -> pool thread, and, once raft's
tick thread resolved the commit, tick -> pool thread -> loop. Each hand-off is a wake-up
and a fight for the GIL with the threads that are busy, and on the leader those threads
are the ones the write path is made of (the loop, raft's tick). The foundation benchmark
(tests/bench/foundation.py) counts the pool's threads as a third of the leader's CPU a
write.

So the bridge runs a write handler in a greenlet on the loop's thread (``run_inline``):
the handler runs as written until it would wait; ``await_inline`` then switches back to
the loop with the awaitable it waits for, the loop awaits it among every other call, and
switches into the handler again with its outcome. The commit wakes the loop directly
(``asyncio.wrap_future``), and no pool thread is involved at all.

The contract: a handler run inline must not block its thread, because its thread is the
loop. Every wait it can reach goes through ``await_inline`` (``RaftNode.propose`` does,
server/raft/node.py, and so does forwarding a write to the leader, server/api/_base.py); a handler that may
wait in any other way (membership changes poll raft, a snapshot restore is large) is
declared ``rpc(..., inline=False)`` and keeps the pool. ``in_inline`` says whether code
runs in such a greenlet, so a shared function can take the right way to wait.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import greenlet

__all__ = ["await_inline", "in_inline", "run_inline"]

T = TypeVar("T")


class _Wait:
    """What an inline handler hands its driver: the awaitable it waits for."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


class _InlineGreenlet(greenlet.greenlet):
    """A greenlet ``run_inline`` drives: ``in_inline`` recognises it by its class."""


def in_inline() -> bool:
    """True inside a handler ``run_inline`` runs: waits must go through ``await_inline``."""
    return isinstance(greenlet.getcurrent(), _InlineGreenlet)


def await_inline(awaitable: Awaitable[T]) -> T:
    """Wait for ``awaitable`` on the loop, from sync code that ``run_inline`` runs; return
    its result or raise its exception, as ``await`` would."""
    current = greenlet.getcurrent()
    driver = current.parent if isinstance(current, _InlineGreenlet) else None
    if driver is None:
        raise RuntimeError("await_inline outside run_inline")
    return cast(T, driver.switch(_Wait(awaitable)))


async def run_inline(fn: Callable[..., T], *args: Any, context: contextvars.Context | None = None) -> T:
    """``fn(*args)`` on this loop's thread, in ``context`` (a copy of the current one by
    default); its ``await_inline`` calls are awaited here."""
    ctx = context if context is not None else contextvars.copy_context()
    child = _InlineGreenlet(lambda: ctx.run(fn, *args))
    outcome: Any = child.switch()
    while not child.dead:
        if not isinstance(outcome, _Wait):
            raise RuntimeError(f"an inline handler switched back with {outcome!r}")
        try:
            value = await outcome.awaitable
        except BaseException as exc:  # handed to the waiting handler, raised where it waits
            outcome = child.throw(exc)
        else:
            outcome = child.switch(value)
    return cast(T, outcome)
