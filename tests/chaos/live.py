"""The live checker during a chaos run: ``Operator.Invariants`` on every live server.

A thread asks each server (never forwarded: each checks its own state) every
``interval_s`` and keeps every answer's violations with the server's applied index. A
server that is down, paused or slow simply misses that round. The checker
(``check_live``) fails a run in which this never got an answer from some server, or the
servers do not implement the RPC: a check that never ran proves nothing.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc

from deploy.cluster import LocalCluster
from drover.v1 import api_pb2, api_pb2_grpc
from tests.chaos.history import History


def ask_invariants(address: str, timeout: float = 2.0) -> tuple[list[str], int, str] | None:
    """(violations, applied index, server) from the server at ``address``, or None."""
    with grpc.insecure_channel(address) as channel:
        try:
            answer = api_pb2_grpc.OperatorStub(channel).Invariants(
                api_pb2.InvariantsRequest(), timeout=timeout
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotImplementedError("the servers do not implement Operator.Invariants") from exc
            return None
    return list(answer.violations), int(answer.index), str(answer.server)


class LiveChecker:
    def __init__(self, cluster: LocalCluster, history: History, interval_s: float = 3.0) -> None:
        self.cluster = cluster
        self.history = history
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.unavailable = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-live-checker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def poll_once(self) -> None:
        for i, address in enumerate(self.cluster.grpc_addresses):
            if self.unavailable or not self.cluster.is_alive(i):
                continue
            try:
                answer = ask_invariants(address)
            except NotImplementedError as exc:
                self.unavailable = str(exc)
                return
            if answer is not None:
                violations, index, server = answer
                self.samples.append(
                    {"t": self.history.now(), "server": server, "index": index, "violations": violations}
                )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll_once()
