"""The history of a chaos run: every request the workload made, with its outcome.

An ``Op`` is one SDK call: when it was invoked and when it completed (seconds since the
run started, monotonic), what it asked for, and how it ended:

* ``ok``: acknowledged, with the raft index of the write (``WriteMeta.index``);
* ``fail``: definitely not applied (Jepsen's "fail"): the only attempt the SDK made was
  answered with an error the servers give before anything is committed, or for an entry
  the FSM refused, which leaves the state untouched (``DEFINITE_ERRORS``: INVALID_ARGUMENT,
  NOT_FOUND, FAILED_PRECONDITION, ...). The checker holds these to "never happened";
* ``info``: failed in a way that does not say whether it was applied. A write whose
  attempt reached the leader may have committed although the caller saw UNAVAILABLE or
  DEADLINE_EXCEEDED; and a definite error after a retried attempt says nothing about the
  earlier attempt (NOT_FOUND can be the retry of a purge that succeeded). The checker
  treats these as concurrent with everything after their invocation: they may or may not
  have happened, at any time.

Jobs and nodes are partitioned between workload threads, so the operations on one key are
sequential (except ``info`` ones, which stay open).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

OK = "ok"
FAIL = "fail"
INFO = "info"
# Errors that say the write was not applied, when they answer the call's only attempt:
# the servers raise them before proposing (validation, missing objects, check-and-set), or
# for an entry the FSM refused (which changes nothing, on every server alike).
DEFINITE_ERRORS: Final = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
    }
)


@dataclass(slots=True)
class Op:
    process: str
    kind: str
    key: str
    args: dict[str, Any]
    t_invoke: float
    t_complete: float = 0.0
    outcome: str = ""
    index: int = 0
    error: str = ""
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    @property
    def failed(self) -> bool:
        """Definitely not applied."""
        return self.outcome == FAIL

    @property
    def unknown(self) -> bool:
        """May or may not have been applied, at any time after its invocation (an op still
        open when the run ended counts too)."""
        return self.outcome not in (OK, FAIL)

    def to_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "kind": self.kind,
            "key": self.key,
            "args": self.args,
            "t_invoke": round(self.t_invoke, 4),
            "t_complete": round(self.t_complete, 4),
            "outcome": self.outcome,
            "index": self.index,
            "error": self.error,
            "result": self.result,
        }


class History:
    """Thread-safe, append-only list of ops; times are seconds since ``origin``."""

    def __init__(self, origin: float | None = None) -> None:
        self.origin = time.monotonic() if origin is None else origin
        self._ops: list[Op] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.origin

    def invoke(self, process: str, kind: str, key: str, **args: Any) -> Op:
        op = Op(process=process, kind=kind, key=key, args=args, t_invoke=self.now())
        with self._lock:
            self._ops.append(op)
        return op

    def add(self, op: Op) -> Op:
        """Append an op built elsewhere (a test's hand-written history)."""
        with self._lock:
            self._ops.append(op)
        return op

    def complete(self, op: Op, *, index: int = 0, **result: Any) -> None:
        op.index = index
        op.result = result
        op.t_complete = self.now()
        op.outcome = OK

    def fail(self, op: Op, error: str, *, definite: bool = False) -> None:
        """The call failed: definitely not applied (``definite``), or outcome unknown."""
        op.error = error
        op.t_complete = self.now()
        op.outcome = FAIL if definite else INFO

    def ops(self) -> list[Op]:
        """A copy of the ops so far, in invocation order."""
        with self._lock:
            return list(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops())

    def first_ack_after(self, t: float, min_index: int) -> Op | None:
        """The earliest-completing acknowledged write after ``t`` with an index above
        ``min_index`` (the leader's commit index just before it was killed)."""
        best: Op | None = None
        for op in self.ops():
            later = op.ok and op.index > min_index and op.t_complete > t
            if later and (best is None or op.t_complete < best.t_complete):
                best = op
        return best
