"""What to do with the server's list of this node's allocs: a pure diff against local runners.

Rules, first match wins, per alloc ID:

| server | local | condition                                                   | bucket    |
|--------|-------|-------------------------------------------------------------|-----------|
| yes    | no    | desired run and client status not terminal                  | start     |
| yes    | no    | otherwise (already stopped, or finished before we knew it)  | ignore    |
| yes    | yes   | desired stop/evict and the runner is not stopping yet       | stop      |
| yes    | yes   | desired run, client ``unknown``, server copy changed        | reconnect |
| yes    | yes   | the server copy changed (``alloc_modify_index`` grew)       | update    |
| yes    | yes   | otherwise                                                   | ignore    |
| no     | yes   | the servers garbage-collected it                            | remove    |

``alloc_modify_index`` moves only on server-side changes (placement, desired status,
the disconnect marks), not on the client's own status updates, so the client's reports
coming back through the blocking query are ignored. ``reconnect`` implies ``update``.

Besides the buckets, ``rewound`` names every alloc whose server copy is *older* than the one
the runner holds (``alloc_modify_index`` went backwards): the state was put back to an
earlier time (``operator snapshot restore``), so what it says about this node's allocs,
their client status included, may be wrong, and the agent resends every status it has
(the clients' real states win: server/restore_followup.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["AllocDiff", "LocalAlloc", "ServerAlloc", "diff_allocs"]

_DESIRED_STOP: Final = frozenset({"stop", "evict"})
_CLIENT_TERMINAL: Final = frozenset({"complete", "failed", "lost"})


@dataclass(frozen=True, slots=True)
class ServerAlloc:
    id: str
    desired_status: str
    client_status: str
    alloc_modify_index: int


@dataclass(frozen=True, slots=True)
class LocalAlloc:
    id: str
    alloc_modify_index: int
    stopping: bool


@dataclass(frozen=True, slots=True)
class AllocDiff:
    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    reconnect: tuple[str, ...] = ()
    update: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    rewound: tuple[str, ...] = ()

    def log_fields(self) -> dict[str, int]:
        return {
            "start": len(self.start),
            "stop": len(self.stop),
            "reconnect": len(self.reconnect),
            "update": len(self.update),
            "remove": len(self.remove),
            "ignore": len(self.ignore),
            "rewound": len(self.rewound),
        }

    @property
    def empty(self) -> bool:
        return not (self.start or self.stop or self.reconnect or self.update or self.remove)


def diff_allocs(server: Iterable[ServerAlloc], local: Mapping[str, LocalAlloc]) -> AllocDiff:
    start: list[str] = []
    stop: list[str] = []
    reconnect: list[str] = []
    update: list[str] = []
    ignore: list[str] = []
    rewound: list[str] = []
    seen: set[str] = set()
    for s in server:
        seen.add(s.id)
        mine = local.get(s.id)
        if mine is None:
            if s.desired_status == "run" and s.client_status not in _CLIENT_TERMINAL:
                start.append(s.id)
            else:
                ignore.append(s.id)
            continue
        changed = s.alloc_modify_index > mine.alloc_modify_index
        if s.alloc_modify_index < mine.alloc_modify_index:
            rewound.append(s.id)
        if s.desired_status in _DESIRED_STOP:
            if not mine.stopping:
                stop.append(s.id)
            elif changed:
                update.append(s.id)
            else:
                ignore.append(s.id)
        elif changed and s.client_status == "unknown":
            reconnect.append(s.id)
            update.append(s.id)
        elif changed:
            update.append(s.id)
        else:
            ignore.append(s.id)
    remove = sorted(set(local) - seen)
    return AllocDiff(
        start=tuple(start),
        stop=tuple(stop),
        reconnect=tuple(reconnect),
        update=tuple(update),
        remove=tuple(remove),
        ignore=tuple(ignore),
        rewound=tuple(rewound),
    )
