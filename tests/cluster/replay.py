"""Summaries equal a recount (docs/design.md#invariant-2) at every raft index of a stopped cluster,
with the offline state tool's replay.

``check_every_index`` reads each server's data dir the way `drover operator raft state`
does (snapshot, then journal through a fresh FSM) and checks, after every entry:

* each parent's children counts are non-negative and equal a recount of its children's
  statuses at that index (and every other summary counter equals a recount from allocs);
* servers agree: where two journals hold the same (index, term), the states are equal.

It also collects every periodic launch entry the FSM accepted or refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from drover.scheduler.structs import JobChildrenSummary
from drover.server.fsm import requests_of, results_of
from drover.server.raft.journal import RECORD_COMMAND
from drover.server.raft_tools import open_data_dir, replay
from drover.server.snapshot import state_digest
from drover.v1 import raft_pb2
from tests.fixtures import mock

ET = raft_pb2.EntryType


@dataclass
class ReplayReport:
    server: str
    indexes: int = 0
    last_index: int = 0
    terms: set[int] = field(default_factory=set)
    # (parent, launch_ns) of launch entries the FSM applied, in log order, and when the
    # leader proposed each (the child's submit time: the leader's clock at that moment).
    launches: list[tuple[str, int]] = field(default_factory=list)
    proposed_ns: list[int] = field(default_factory=list)
    refused_launches: list[tuple[str, int, str]] = field(default_factory=list)
    children_seen: Counter[str] = field(default_factory=Counter)
    digests: dict[tuple[int, int], str] = field(default_factory=dict)


def check_every_index(data_dir: Path, parents: list[str]) -> ReplayReport:
    report = ReplayReport(server=data_dir.name)
    with open_data_dir(str(data_dir)) as data:
        for step in replay(data):
            record, tables = step.record, step.tables
            report.indexes += 1
            report.last_index = record.index
            report.terms.add(record.term)
            where = f"{data_dir.name} index {record.index} (term {record.term})"
            for parent in parents:
                key = ("default", parent)
                summary = tables.job_summaries.get(key)
                if summary is None:
                    continue
                have = summary.children or JobChildrenSummary()
                want = mock.recount_children(tables, *key)
                assert min(have.pending, have.running, have.dead) >= 0, f"{where}: {parent} children {have}"
                assert have == want, f"{where}: {parent} children {have}, recount {want}"
            problems = mock.summary_problems(tables)
            assert not problems, f"{where}:\n" + "\n".join(problems)
            report.digests[(record.index, record.term)] = state_digest(tables)
            if record.kind == RECORD_COMMAND and step.result is not None:
                # A batch entry (group commit) carries several requests, each with its result.
                for data, result in zip(requests_of(record.data), results_of(step.result), strict=False):
                    _note_launch(report, data, result.error)
    return report


def _note_launch(report: ReplayReport, data: bytes, error: str) -> None:
    entry = raft_pb2.LogEntry.FromString(data)
    if entry.type != ET.ENTRY_TYPE_JOB_REGISTER:
        return
    body = raft_pb2.JobRegisterEntry.FromString(entry.payload)
    if body.HasField("launch"):
        if error:
            report.refused_launches.append((body.launch.job_id, body.launch.launch_ns, error))
        else:
            report.launches.append((body.launch.job_id, body.launch.launch_ns))
            report.proposed_ns.append(body.job.submit_time_ns)
    if not error and body.job.parent_id:
        report.children_seen[body.job.id] += 1


def assert_servers_agree(reports: list[ReplayReport]) -> int:
    """States are equal wherever two journals hold the same (index, term); returns how many
    such indexes were compared."""
    compared = 0
    first, *others = reports
    for other in others:
        for key, digest in other.digests.items():
            if key in first.digests:
                compared += 1
                assert first.digests[key] == digest, f"{first.server} and {other.server} differ at {key}"
    return compared
