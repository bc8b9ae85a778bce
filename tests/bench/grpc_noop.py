"""Ceiling A: a do-nothing unary gRPC call, server and client in separate processes.

The server is grpcio's sync server with one thread pool and a generic handler that returns
an empty message (no protobuf work on either side). The client uses the same channel
options as drover's SDK, one channel per thread, as the drover benchmark does.

Run as a module it is the server: ``python -m tests.bench.grpc_noop --port-file F``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, Final

import grpc

from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS
from tests.bench import _procs
from tests.bench._load import Operation, closed_loop
from tests.bench._pyspy import thread_cpu_by_role

SERVICE: Final = "drover.bench.Noop"
METHOD: Final = "Call"
OP_TIMEOUT_S: Final = 5.0


def _noop(_request: bytes, _context: grpc.ServicerContext) -> bytes:
    return b""


def serve(port_file: Path, workers: int) -> None:
    stop = _procs.child_stop_event()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
        options=[*MESSAGE_SIZE_OPTIONS, ("grpc.so_reuseport", 0)],
    )
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(_noop)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _procs.write_json(port_file, {"port": port, "pid": os.getpid()})
    while not stop.wait(1.0):
        pass
    server.stop(1.0).wait(3.0)


@contextlib.contextmanager
def _noop_caller(address: str) -> Iterator[Operation]:
    channel = grpc.insecure_channel(address, options=list(MESSAGE_SIZE_OPTIONS))
    try:
        grpc.channel_ready_future(channel).result(timeout=10.0)
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/{SERVICE}/{METHOD}")

        def op() -> None:
            call(b"", timeout=OP_TIMEOUT_S)

        yield op
    finally:
        channel.close()


def measure_grpc_noop(*, threads: int, server_workers: int, warmup: float, duration: float) -> dict[str, Any]:
    """Requests/s and latency of the no-op call from ``threads`` client threads."""
    max_seconds = warmup + duration + 90.0
    with (
        tempfile.TemporaryDirectory(prefix="drover-bench-noop-") as tmp,
        _procs.children_stopped_on_exit() as kids,
    ):
        port_file = Path(tmp) / "port.json"
        argv = _procs.python_module_argv(
            "tests.bench.grpc_noop", "--port-file", str(port_file), "--workers", str(server_workers)
        )
        server = _procs.spawn("grpc-noop-server", argv, Path(tmp) / "server.log", max_seconds)
        kids.append(server)
        info = _procs.wait_until(lambda: _procs.read_json(port_file), 30.0, "the no-op server's port", kids)
        address = f"127.0.0.1:{info['port']}"
        result = closed_loop(
            lambda _i: _noop_caller(address),
            threads=threads,
            warmup=warmup,
            duration=duration,
            cpu_pids={"server": server.pid, "bench_client": os.getpid()},
            op_timeout=OP_TIMEOUT_S,
            threads_of="server",
        )
        out = result.summary()
        out.update(client_threads=threads, server_workers=server_workers, requests_per_s=out["per_s"])
        out["server_threads"] = thread_cpu_by_role(server.pid, result.thread_percent, out["per_s"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the no-op gRPC server of the foundation benchmark")
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args(argv)
    serve(args.port_file, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
