"""Files at rest are their owner's alone, whatever the umask: data dirs 0700, files 0600.

Each writer is run under umask 0022 (what a default shell gives), so a mode that came
from the umask rather than from the writer shows. tests/cluster/test_raft_security.py
checks the same on the files of real server and client processes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pysyncobj.config import SERIALIZER_STATE

from deploy.cluster import wait_for
from drover.cli.operator import _write_file_atomically
from drover.client.state import StateDB
from drover.server.datadir import DataDirLock, open_private, private_dir
from drover.server.fsm import FSM
from drover.server.raft.snapshot_writer import SnapshotWriter
from drover.server.state_store import StateStore


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_private_dir__creates_and_narrows_to_0700(tmp_path: Path) -> None:
    fresh = Path(private_dir(str(tmp_path / "a" / "b")))
    existing = tmp_path / "open"
    existing.mkdir(mode=0o777)
    existing.chmod(0o777)
    private_dir(str(existing))

    assert _mode(fresh) == 0o700
    assert _mode(existing) == 0o700


def test_open_private__creates_and_narrows_to_0600(tmp_path: Path) -> None:
    existing = tmp_path / "old"
    existing.write_text("x")
    existing.chmod(0o644)
    for path in (tmp_path / "new", existing):
        os.close(open_private(str(path), os.O_WRONLY))
        assert _mode(path) == 0o600, path


def test_data_dir_lock__dir_0700_lock_0600(tmp_path: Path) -> None:
    with DataDirLock(str(tmp_path / "server")) as lock:
        assert _mode(Path(lock.path)) == 0o600
    assert _mode(tmp_path / "server") == 0o700


def test_snapshot_writer__snapshot_file_0600(tmp_path: Path) -> None:
    dump = tmp_path / "snapshot.pb"
    writer = SnapshotWriter(str(dump), FSM(StateStore()))
    writer.attach(lambda: 10)
    entry = (b"", 5, 1)

    writer.serialize("unused", (entry, entry, []))
    wait_for(lambda: writer.check() == SERIALIZER_STATE.SUCCESS, 10, message="the snapshot to be written")

    assert _mode(dump) == 0o600


def test_client_state__dirs_0700_records_0600(tmp_path: Path) -> None:
    data_dir = tmp_path / "client-data"
    data_dir.mkdir(mode=0o755)
    db = StateDB(data_dir)
    db.load_or_create_identity(lambda: "id")

    assert {_mode(p) for p in (data_dir, data_dir / "client", data_dir / "client" / "allocs")} == {0o700}
    assert _mode(data_dir / "client" / "node.json") == 0o600


def test_snapshot_save_output__0600_even_over_an_open_file(tmp_path: Path) -> None:
    target = tmp_path / "state.snap"
    target.write_bytes(b"old")
    target.chmod(0o644)

    _write_file_atomically(str(target), b"state")

    assert target.read_bytes() == b"state"
    assert _mode(target) == 0o600
