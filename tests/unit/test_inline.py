"""server/inline.py: sync code run in a greenlet on an event loop, its waits awaited by the
loop. Pure logic on a private loop (``asyncio.run``), no server."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import Future

import pytest

from drover.server.inline import await_inline, in_inline, run_inline

_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="nobody")


def test_run_inline__waits_on_the_loop_and_returns_what_the_code_returns() -> None:
    seen: list[object] = []

    def handler(x: int) -> int:
        seen.append((in_inline(), threading.current_thread().name))
        first = await_inline(asyncio.sleep(0, result=x + 1))
        second = await_inline(asyncio.sleep(0, result=first * 10))
        return second + 1

    async def main() -> tuple[int, str]:
        return await run_inline(handler, 4), threading.current_thread().name

    result, loop_thread = asyncio.run(main())
    assert result == 51
    assert seen == [(True, loop_thread)]


def test_run_inline__many_handlers_wait_at_once_on_one_thread() -> None:
    """Twenty handlers each wait for a future another thread resolves: all twenty are waiting
    before any is resolved, so none holds a thread."""
    gate: Future[str] = Future()
    waiting: list[int] = []

    def handler(i: int) -> str:
        waiting.append(i)
        return f"{i}:" + await_inline(asyncio.wrap_future(gate))

    async def main() -> list[str]:
        tasks = [asyncio.ensure_future(run_inline(handler, i)) for i in range(20)]
        while len(waiting) < 20:
            await asyncio.sleep(0.001)
        threading.Thread(target=lambda: gate.set_result("ok")).start()
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == [f"{i}:ok" for i in range(20)]


def test_run_inline__an_awaited_failure_is_raised_where_the_code_waits() -> None:
    async def fails() -> None:
        raise TimeoutError("not committed")

    def handler() -> str:
        try:
            await_inline(fails())
        except TimeoutError as exc:
            return f"caught {exc}"
        return "not raised"

    async def main() -> str:
        return await run_inline(handler)

    assert asyncio.run(main()) == "caught not committed"


def test_run_inline__what_the_code_raises_reaches_the_awaiting_coroutine() -> None:
    def handler() -> None:
        await_inline(asyncio.sleep(0))
        raise ValueError("job: required")

    async def main() -> None:
        await run_inline(handler)

    with pytest.raises(ValueError, match="job: required"):
        asyncio.run(main())


def test_run_inline__runs_in_the_context_it_is_given() -> None:
    context = contextvars.copy_context()
    context.run(_CALLER.set, "node n1")

    def handler() -> str:
        before = _CALLER.get()
        await_inline(asyncio.sleep(0))
        return f"{before}/{_CALLER.get()}"

    async def main() -> str:
        return await run_inline(handler, context=context)

    assert asyncio.run(main()) == "node n1/node n1"
    assert _CALLER.get() == "nobody"


def test_await_inline__outside_run_inline__refused() -> None:
    assert not in_inline()
    awaitable = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="outside run_inline"):
        await_inline(awaitable)
    awaitable.close()
