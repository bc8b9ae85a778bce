"""Offline tools on a data dir (server/raft_tools.py, `drover operator raft logs|state`,
`drover operator snapshot inspect`).

The journals here are written by pysyncobj's own ``FileJournal`` with the exact command
bytes a drover server appends (a type byte, then pysyncobj's pickle of
``(func_id, (LogEntry bytes,))``), so the reader is tested against the real format; the
cluster tests read journals of real server processes.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal
from pysyncobj.syncobj import _COMMAND_TYPE

from drover.cli import main
from drover.scheduler.structs import JobChildrenSummary
from drover.server.datadir import DataDirLock
from drover.server.fsm import FSM
from drover.server.raft_tools import (
    OfflineError,
    inspect_snapshot,
    log_entries,
    open_data_dir,
    replay,
    state_json,
)
from drover.server.snapshot import to_snapshot
from drover.server.state_store import StateStore, Tables
from drover.v1 import raft_pb2
from tests.fixtures import mock

PARENT = mock.periodic_job(id="cron")
CHILD = mock.periodic_child(PARENT, mock.NOW)


def regular(entry: bytes) -> bytes:
    return bytes([_COMMAND_TYPE.REGULAR]) + pickle.dumps((0, (entry,)), 2)


NOOP = bytes([_COMMAND_TYPE.NO_OP])

# (raft index, term, command): a no-op per term, as pysyncobj writes them.
LOG = [
    (1, 1, NOOP),
    (2, 1, regular(mock.register_job_entry(PARENT))),
    (3, 2, NOOP),
    (4, 2, regular(mock.register_job_entry(CHILD, mock.eval_for(CHILD, id="eval-c")))),
    (5, 2, regular(mock.raw_entry(raft_pb2.ENTRY_TYPE_RECONCILE_SUMMARIES))),
]


def write_data_dir(root: Path, log: list[tuple[int, int, bytes]], snapshot: Tables | None = None) -> Path:
    raft = root / "raft"
    raft.mkdir(parents=True)
    journal = FileJournal(str(raft / "journal.bin"))
    for index, term, command in log:
        journal.add(command, index, term)
    journal._destroy()
    if snapshot is not None:
        msg = raft_pb2.RaftSnapshotFile(state=to_snapshot(snapshot))
        msg.last_entry.index = snapshot.index
        msg.last_entry.term = 1
        (raft / "snapshot.pb").write_bytes(msg.SerializeToString())
    return root


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return write_data_dir(tmp_path / "s1", LOG)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------
# raft logs


def test_raft_logs__one_json_object_per_entry_with_decoded_body(data_dir: Path) -> None:
    with open_data_dir(str(data_dir)) as data:
        entries = list(log_entries(data))

    assert [(e["index"], e["term"], e["type"]) for e in entries] == [
        (1, 1, "RAFT_NOOP"),
        (2, 1, "ENTRY_TYPE_JOB_REGISTER"),
        (3, 2, "RAFT_NOOP"),
        (4, 2, "ENTRY_TYPE_JOB_REGISTER"),
        (5, 2, "ENTRY_TYPE_RECONCILE_SUMMARIES"),
    ]
    child = entries[3]["body"]
    assert child["job"]["id"] == CHILD.id
    assert child["job"]["parent_id"] == "cron"
    # What the leader sent, visible as in docs/field-reports.md#field-report-2.
    assert child["job"]["status"] == ""
    assert child["eval"]["id"] == "eval-c"


def test_raft_logs__cli_prints_json_lines(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "operator", "raft", "logs", "-data-dir", str(data_dir))

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == len(LOG)
    assert json.loads(lines[3])["body"]["job"]["id"] == CHILD.id


def test_journal__a_pickle_that_loads_anything_else__refused(tmp_path: Path) -> None:
    evil = bytes([_COMMAND_TYPE.REGULAR]) + pickle.dumps((0, (Path("/etc/passwd"),)), 2)
    root = write_data_dir(tmp_path / "s1", [(1, 1, evil)])

    with pytest.raises(OfflineError, match="refusing to load"), open_data_dir(str(root)):
        pass


# ---------------------------------------------------------------------------------------
# raft state


def test_raft_state__every_index__the_state_the_server_had(data_dir: Path) -> None:
    with open_data_dir(str(data_dir)) as data:
        steps = list(replay(data))

    assert [s.record.index for s in steps] == [1, 2, 3, 4, 5]
    assert [s.tables.index for s in steps] == [0, 2, 2, 4, 5]  # no-ops change nothing
    for step in steps:
        assert mock.summary_problems(step.tables) == []
    summary = steps[3].tables.job_summaries[("default", "cron")]
    assert summary.children == JobChildrenSummary(pending=1)


def test_raft_state__last_index__stops_there(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "operator", "raft", "state", "-data-dir", str(data_dir), "-last-index", "3")

    assert code == 0
    doc = json.loads(out)
    assert (doc["raft_index"], doc["index"]) == (3, "2")
    assert [j["id"] for j in doc["jobs"]] == ["cron"]
    [summary] = doc["job_summaries"]
    assert summary["children"] == {"pending": "0", "running": "0", "dead": "0"}


def test_raft_state__negative_last_index__counts_back_from_the_end(data_dir: Path) -> None:
    with open_data_dir(str(data_dir)) as data:
        assert state_json(data, -1)["raft_index"] == 4
        assert state_json(data)["raft_index"] == 5


def test_raft_state__past_the_end__clear_error(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "operator", "raft", "state", "-data-dir", str(data_dir), "-last-index", "9")

    assert (code, out) == (1, "")
    assert err == "Error: -last-index 9 is past the end of the log (index 5)\n"


def test_raft_state__from_snapshot_then_journal(tmp_path: Path) -> None:
    """After compaction the journal starts after the snapshot: replay starts from it."""
    full = write_data_dir(tmp_path / "full", LOG)
    with open_data_dir(str(full)) as data:
        at_2 = [s.tables for s in replay(data, 2)][-1]
    compacted = write_data_dir(tmp_path / "compacted", LOG[2:], snapshot=at_2)

    with open_data_dir(str(compacted)) as data:
        steps = list(replay(data))
        assert [s.record.index for s in steps] == [3, 4, 5]
        assert steps[-1].tables.job_summaries[("default", "cron")].children == JobChildrenSummary(pending=1)
        with pytest.raises(OfflineError, match="before the snapshot"):
            list(replay(data, 1))


# ---------------------------------------------------------------------------------------
# Refusals


def test_offline_tools__refuse_while_a_server_holds_the_data_dir(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with DataDirLock(str(data_dir)):
        for tool in ("logs", "state"):
            code, out, err = run(capsys, "operator", "raft", tool, "-data-dir", str(data_dir))
            assert (code, out) == (1, "")
            assert err.startswith(f"Error: data dir {data_dir} is in use by a running server")
            assert err.count("\n") == 1

    assert run(capsys, "operator", "raft", "logs", "-data-dir", str(data_dir))[0] == 0


def test_offline_tools__no_data_dir__clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "operator", "raft", "logs", "-data-dir", str(tmp_path / "nope"))

    assert (code, err) == (1, f"Error: data dir {tmp_path / 'nope'} does not exist\n")
    assert not (tmp_path / "nope").exists()


# ---------------------------------------------------------------------------------------
# snapshot inspect


@pytest.fixture
def state() -> Tables:
    """The state after LOG, applied straight through an FSM."""
    store = StateStore()
    fsm = FSM(store)
    for index, _term, command in LOG:
        if command[0] == _COMMAND_TYPE.REGULAR:
            fsm.apply(pickle.loads(command[1:])[1][0], index)
    return store.snapshot().tables


def test_snapshot_inspect__saved_snapshot(tmp_path: Path, state: Tables) -> None:
    path = tmp_path / "backup.snap"
    path.write_bytes(to_snapshot(state).SerializeToString())

    info = inspect_snapshot(str(path))

    assert (info["format"], info["index"], info["size"]) == ("state snapshot", 5, path.stat().st_size)
    counts = {t["name"]: t["count"] for t in info["tables"]}
    assert (counts["jobs"], counts["evals"], counts["job_summaries"], counts["allocs"]) == (2, 1, 2, 0)


def test_snapshot_inspect__raft_snapshot_file__cli(
    tmp_path: Path, state: Tables, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_data_dir(tmp_path / "s1", LOG[4:], snapshot=state)

    code, out, _ = run(capsys, "operator", "snapshot", "inspect", str(root / "raft" / "snapshot.pb"))

    assert code == 0
    fields = dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line)
    assert {k.strip(): v for k, v in fields.items()}["Format"] == "raft snapshot"
    assert {k.strip(): v for k, v in fields.items()}["Index"] == "5"
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line and " = " not in line}
    assert rows["Table"] == ["Count", "Size"]
    assert rows["jobs"][0] == "2" and rows["job_summaries"][0] == "2" and rows["evals"][0] == "1"


def test_snapshot_inspect__not_a_snapshot__clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "junk"
    path.write_bytes(b"\x0a\xff\xff\xff")

    code, _, err = run(capsys, "operator", "snapshot", "inspect", str(path))

    assert code == 1
    assert err.startswith(f"Error: {path}: not a drover snapshot")
