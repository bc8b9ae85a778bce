"""Local persistent state in ``data_dir``: the node's identity and one record per alloc.

Layout::

    <data_dir>/client/node.json               {"node_id", "secret_id"}: made once (uuid4)
    <data_dir>/client/meta.json               the node's dynamic meta (``node meta apply``)
    <data_dir>/client/allocs/<alloc_id>.json  the alloc and its job as the server sent them,
                                              and per task: state, driver handle, restarts
    <data_dir>/allocs/<alloc_id>/<task>/      task working directories and logs (drivers)

The node's secret and every job's config live here, so the data dir is the agent's alone:
directories 0700, files 0600, whatever the umask.

Every file is replaced atomically (write a temporary file, fsync, rename, fsync the
directory): a crash leaves the old record or the new one, never half of one. A record is
written on every task state change, BEFORE the change is reported to the servers, so what
the servers were told is never ahead of what a restarted agent will find.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
from google.protobuf import json_format

from drover.client.errors import StateError
from drover.client.restarts import RestartWindow
from drover.common.taskstate import TaskState
from drover.v1 import structs_pb2

__all__ = ["AllocRecord", "NodeIdentity", "StateDB", "TaskRecord", "atomic_write_json"]

FORMAT_VERSION: Final = 1
PRIVATE_DIR_MODE: Final = 0o700
PRIVATE_FILE_MODE: Final = 0o600
log = structlog.get_logger("drover.client.state")


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node_id: str
    secret_id: str


@dataclass(frozen=True, slots=True)
class TaskRecord:
    state: TaskState
    # The driver handle's state() while the task may be running; None otherwise.
    handle: Mapping[str, Any] | None = None
    window: RestartWindow = field(default_factory=RestartWindow)

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.to_dict(),
            "handle": dict(self.handle) if self.handle is not None else None,
            "window": self.window.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskRecord:
        handle = data.get("handle")
        return cls(
            state=TaskState.from_dict(data.get("state", {})),
            handle=dict(handle) if isinstance(handle, dict) else None,
            window=RestartWindow.from_dict(data.get("window")),
        )


@dataclass(frozen=True, slots=True)
class AllocRecord:
    alloc: structs_pb2.Allocation
    job: structs_pb2.Job | None
    tasks: Mapping[str, TaskRecord] = field(default_factory=dict)
    # The alloc was told to stop (server desired stop, stop_on_client_after): a restarted
    # agent finishes stopping it instead of running it again.
    stop_requested: bool = False
    stop_reason: str = ""

    @property
    def alloc_id(self) -> str:
        return self.alloc.id

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "alloc": json_format.MessageToDict(self.alloc, preserving_proto_field_name=True),
            "job": json_format.MessageToDict(self.job, preserving_proto_field_name=True)
            if self.job is not None
            else None,
            "tasks": {name: rec.to_dict() for name, rec in sorted(self.tasks.items())},
            "stop_requested": self.stop_requested,
            "stop_reason": self.stop_reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AllocRecord:
        alloc = json_format.ParseDict(data["alloc"], structs_pb2.Allocation(), ignore_unknown_fields=True)
        job = None
        if data.get("job") is not None:
            job = json_format.ParseDict(data["job"], structs_pb2.Job(), ignore_unknown_fields=True)
        return cls(
            alloc=alloc,
            job=job,
            tasks={str(n): TaskRecord.from_dict(t) for n, t in dict(data.get("tasks", {})).items()},
            stop_requested=bool(data.get("stop_requested", False)),
            stop_reason=str(data.get("stop_reason", "")),
        )


def atomic_write_json(path: Path, value: object) -> None:
    """Replace ``path`` with ``value`` as JSON, all or nothing, durable once this returns."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    data = json.dumps(value, indent=1, sort_keys=True).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fd, PRIVATE_FILE_MODE)  # a leftover tmp file keeps its old mode
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise StateError(f"cannot write {path}: {exc.strerror or exc}") from exc


class StateDB:
    """The agent's files under ``data_dir``. Writers of one alloc are serialized by its runner."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self._client_dir = self.data_dir / "client"
        self._allocs_dir = self._client_dir / "allocs"
        try:
            self._allocs_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
            for directory in (self.data_dir, self._client_dir, self._allocs_dir):
                directory.chmod(PRIVATE_DIR_MODE)
        except OSError as exc:
            raise StateError(f"cannot create {self._allocs_dir}: {exc.strerror or exc}") from exc

    @property
    def alloc_dirs_root(self) -> Path:
        """Where drivers put task directories: ``<data_dir>/allocs``."""
        return self.data_dir / "allocs"

    def load_or_create_identity(self, new_id: Callable[[], str]) -> NodeIdentity:
        """The node ID and secret, made with ``new_id`` on first start and kept for good."""
        path = self._client_dir / "node.json"
        if path.exists():
            try:
                data = json.loads(path.read_text())
                return NodeIdentity(node_id=str(data["node_id"]), secret_id=str(data["secret_id"]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # Never silently become another node: that would orphan every alloc.
                raise StateError(f"{path} is unreadable ({exc}); fix or remove it") from exc
        identity = NodeIdentity(node_id=new_id(), secret_id=new_id())
        atomic_write_json(path, {"node_id": identity.node_id, "secret_id": identity.secret_id})
        return identity

    def load_dynamic_meta(self) -> dict[str, str]:
        """The meta an operator set with ``node meta apply`` ({} before the first)."""
        path = self._client_dir / "meta.json"
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            # Refuse rather than register without it: constraints on it would move allocs.
            raise StateError(f"{path} is unreadable ({exc}); fix or remove it") from exc
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise StateError(f"{path}: expected a JSON object of strings")
        return {str(k): v for k, v in data.items()}

    def put_dynamic_meta(self, meta: Mapping[str, str]) -> None:
        atomic_write_json(self._client_dir / "meta.json", dict(meta))

    def _alloc_path(self, alloc_id: str) -> Path:
        if not alloc_id or "/" in alloc_id or alloc_id.startswith("."):
            raise StateError(f"refusing alloc ID {alloc_id!r} as a file name")
        return self._allocs_dir / f"{alloc_id}.json"

    def put_alloc(self, record: AllocRecord) -> None:
        atomic_write_json(self._alloc_path(record.alloc_id), record.to_dict())

    def delete_alloc(self, alloc_id: str) -> None:
        try:
            self._alloc_path(alloc_id).unlink(missing_ok=True)
        except OSError as exc:
            raise StateError(f"cannot remove the record of alloc {alloc_id}: {exc}") from exc

    def load_allocs(self) -> list[AllocRecord]:
        """Every readable alloc record; an unreadable one is renamed ``*.corrupt`` and skipped."""
        records = []
        for path in sorted(self._allocs_dir.glob("*.json")):
            try:
                records.append(AllocRecord.from_dict(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError, json_format.ParseError) as exc:
                log.error("state.alloc_record_unreadable", path=str(path), error=str(exc))
                try:
                    path.rename(path.with_suffix(".corrupt"))
                except OSError:
                    pass
        return records
