"""The accept benchmark: a call of its own per request, or a message on an open stream.

Why drover's heartbeat is a message on a stream (``Nodes.Heartbeat``, docs/design.md,
"Serving the API to a fleet"): grpc.aio's server asks grpc core for one new call at a time,
and each new call is a hand-off from grpc's poller thread to the event loop, a GIL
acquisition each way. With other Python threads busy in the process (a server's scheduler
workers, raft's tick), each hand-off waits for the GIL, and new calls queue. Messages on
streams already open complete together, in one wake-up of the loop.

Measured here with nothing of drover's: one server process (a grpc.aio echo server, plus
``busy_threads`` threads spinning in Python), one client process with ``callers``
concurrent callers, each sending one small request every ``callers / rate`` seconds for
``window_s`` seconds, either as a unary call each (``unary``) or as a message on one
bidirectional stream per caller (``stream``; each stream's first message, which opens
it, is not timed). Per case: answers per second, the latency percentiles, and the callers
whose request was still unanswered 10 s after the window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Final

import grpc

from deploy.cluster import pick_free_ports
from tests.bench._stats import latency_ms

NAME: Final = "grpc_accept"
_SERVICE: Final = "bench.Accept"
_PAYLOAD: Final = b"x" * 64
# How long past the window a request may still be answered; what is not is counted.
_GRACE_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class AcceptConfig:
    callers: int = 1000
    rate_per_s: float = 250.0
    window_s: float = 20.0
    busy_threads: tuple[int, ...] = (0, 1, 2)
    modes: tuple[str, ...] = ("unary", "stream")

    @classmethod
    def make(cls, *, quick: bool, duration: float | None = None) -> AcceptConfig:
        window = duration if duration is not None else (8.0 if quick else 20.0)
        return cls(window_s=window)

    def budget_s(self) -> float:
        # Each case: the window and its grace, and the server and client start.
        return len(self.busy_threads) * len(self.modes) * (self.window_s + _GRACE_S + 40.0)


# --- the server process --------------------------------------------------------------------------


def _spin(stop: threading.Event) -> None:
    """A busy Python thread: holds the GIL but for the interpreter's switch interval."""
    total = 0
    while not stop.is_set():
        for i in range(10_000):
            total += i * i


async def _echo(request: bytes, _context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return request


async def _echo_stream(
    requests: AsyncIterator[bytes], _context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


def _serve(port: int, busy_threads: int, ready: Any) -> None:
    stop = threading.Event()
    for _ in range(busy_threads):
        threading.Thread(target=_spin, args=(stop,), daemon=True).start()

    async def main() -> None:
        server = grpc.aio.server()
        handlers = grpc.method_handlers_generic_handler(
            _SERVICE,
            {
                "Echo": grpc.unary_unary_rpc_method_handler(_echo),
                "EchoStream": grpc.stream_stream_rpc_method_handler(_echo_stream),
            },
        )
        server.add_generic_rpc_handlers((handlers,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


# --- the client process --------------------------------------------------------------------------


async def _callers(port: int, cfg: AcceptConfig, mode: str) -> tuple[list[float], int]:
    """Every answered request's latency, and how many were still unanswered at the end of
    the window plus ``_GRACE_S`` (each request's deadline), so that a case whose queue
    never drains still ends."""
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(8)]
    latencies: list[float] = []
    unanswered = 0
    period = cfg.callers / cfg.rate_per_s
    rng = random.Random(0)
    end = time.monotonic() + cfg.window_s

    def deadline_s() -> float:
        return max(0.1, end + _GRACE_S - time.monotonic())

    async def unary(channel: grpc.aio.Channel) -> None:
        nonlocal unanswered
        call = channel.unary_unary(f"/{_SERVICE}/Echo")
        await asyncio.sleep(rng.random() * period)
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                await call(_PAYLOAD, timeout=deadline_s())
            except grpc.aio.AioRpcError:
                unanswered += 1
                return
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(period)

    async def stream(channel: grpc.aio.Channel) -> None:
        nonlocal unanswered
        up: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def requests() -> AsyncIterator[bytes]:
            while (message := await up.get()) is not None:
                yield message

        call = channel.stream_stream(f"/{_SERVICE}/EchoStream")(requests(), timeout=cfg.window_s + _GRACE_S)
        try:
            await up.put(_PAYLOAD)  # opens the stream: not timed
            await asyncio.wait_for(call.read(), deadline_s())
            await asyncio.sleep(rng.random() * period)
            while time.monotonic() < end:
                started = time.monotonic()
                await up.put(_PAYLOAD)
                await asyncio.wait_for(call.read(), deadline_s())
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(period)
        except (TimeoutError, grpc.aio.AioRpcError):
            unanswered += 1
        finally:
            await up.put(None)
            call.cancel()

    caller = unary if mode == "unary" else stream
    await asyncio.gather(*(caller(channels[i % len(channels)]) for i in range(cfg.callers)))
    for channel in channels:
        await channel.close()
    return latencies, unanswered


def _call(port: int, cfg: AcceptConfig, mode: str, out: Any) -> None:
    out.put(asyncio.run(_callers(port, cfg, mode)))


def _case(cfg: AcceptConfig, mode: str, busy_threads: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    (port,) = pick_free_ports(1)
    ready, out = ctx.Event(), ctx.Queue()
    server = ctx.Process(target=_serve, args=(port, busy_threads, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the echo server did not start")
        client = ctx.Process(target=_call, args=(port, cfg, mode, out), daemon=True)
        client.start()
        try:
            latencies, unanswered = out.get(timeout=cfg.window_s + _GRACE_S + 60)
        finally:
            client.join(10)
            if client.is_alive():
                client.kill()
    finally:
        server.kill()
        server.join(10)
    return {
        "mode": mode,
        "busy_threads": busy_threads,
        "answered": len(latencies),
        "answered_per_s": round(len(latencies) / cfg.window_s, 1),
        "unanswered_at_the_end": unanswered,
        "latency_ms": latency_ms(latencies),
    }


def _cases(cfg: AcceptConfig) -> Iterator[tuple[str, int]]:
    for busy in cfg.busy_threads:
        for mode in cfg.modes:
            yield mode, busy


def run_accept(cfg: AcceptConfig) -> dict[str, Any]:
    results = [_case(cfg, mode, busy) for mode, busy in _cases(cfg)]
    return {"config": dataclasses.asdict(cfg), "results": {"cases": results}}


def summary_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for case in doc["results"]["cases"]:
        lat = case["latency_ms"]
        lines.append(
            f"  {case['mode']:6s} {case['busy_threads']} busy threads: {case['answered_per_s']}/s answered, "
            f"p50 {lat.get('p50')} ms p99 {lat.get('p99')} ms max {lat.get('max')} ms, "
            f"{case['unanswered_at_the_end']} unanswered at the end"
        )
    return lines
