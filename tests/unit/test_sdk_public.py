"""The SDK's public surface beside the RPC methods (proto/drover/sdk.py): job files read as
the CLI reads them, blocking queries as iterators, and what importing it loads."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from drover import sdk
from drover.sdk import Client, DroverClient, JobFileError, blocking, parse_job, parse_job_file
from drover.v1 import api_pb2, structs_pb2

VALID = """
job "web" {
  group "api" {
    count = 2
    task "app" {
      driver = "mock"
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def test_client__the_old_name_is_the_same_class() -> None:
    assert DroverClient is Client
    assert {"Client", "DroverError", "parse_job_file", "blocking"} <= set(sdk.__all__)


def test_parse_job__valid_hcl__the_wire_job() -> None:
    job = parse_job(VALID)

    assert isinstance(job, structs_pb2.Job)
    assert (job.id, job.groups[0].name, job.groups[0].count) == ("web", "api", 2)
    assert job.groups[0].tasks[0].driver == "mock"


def test_parse_job__every_broken_rule_at_once() -> None:
    text = VALID.replace("count = 2", "count = -1").replace("memory = 32", "memory = -5")

    with pytest.raises(JobFileError) as err:
        parse_job(text, filename="web.hcl")

    fields = sorted(e.split(":")[0] for e in err.value.errors)
    assert fields == ["job.groups[0].count", "job.groups[0].tasks[0].resources.memory_mb"], err.value.errors
    assert str(err.value) == "; ".join(err.value.errors)


def test_parse_job__without_validate__a_job_that_breaks_rules_is_returned() -> None:
    job = parse_job(VALID.replace("count = 2", "count = -1"), validate=False)

    assert job.groups[0].count == -1


def test_parse_job__syntax_error__names_the_file_and_place() -> None:
    with pytest.raises(JobFileError) as err:
        parse_job('job "web" {\n  group "api" {\n', filename="web.hcl")

    assert str(err.value).startswith("web.hcl:")
    assert err.value.errors == ()


def test_parse_job_file__reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "web.hcl"
    path.write_text(VALID)

    assert parse_job_file(path).id == "web"


def test_parse_job_file__not_utf8__job_file_error_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "web.hcl"
    path.write_bytes(b'job "w\xff" {}')

    with pytest.raises(JobFileError, match=r"web\.hcl: not valid UTF-8 text \(byte 0xff at offset 6\)"):
        parse_job_file(path)


def test_parse_job_file__missing_file__the_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        parse_job_file(tmp_path / "nope.hcl")


class _ScriptOver(Exception):
    """Every scripted answer is given: ends the iteration under test."""


@dataclass
class _ScriptedReads:
    """A read that answers with the scripted indexes in turn, recording each min_index."""

    indexes: list[int]
    asked: list[int] = field(default_factory=list)

    def __call__(self, min_index: int) -> api_pb2.JobSummaryResponse:
        self.asked.append(min_index)
        if not self.indexes:
            raise _ScriptOver
        return api_pb2.JobSummaryResponse(meta=api_pb2.QueryMeta(index=self.indexes.pop(0)))


def _all(answers: Iterator[api_pb2.JobSummaryResponse]) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(_ScriptOver):
        for answer in answers:
            out.append(answer.meta.index)
    return out


def test_blocking__yields_each_new_index_and_waits_past_the_last() -> None:
    # 7 first; 7 again (the wait ended, nothing changed); then 9; then 12.
    reads = _ScriptedReads([7, 7, 9, 12])

    assert _all(blocking(reads)) == [7, 9, 12]
    assert reads.asked == [0, 7, 7, 9, 12]


def test_blocking__from_an_index__only_what_is_newer() -> None:
    reads = _ScriptedReads([5, 6])

    assert _all(blocking(reads, index=5)) == [6]
    assert reads.asked == [5, 5, 6]


def test_blocking__an_index_that_went_backwards_is_yielded_and_waited_past() -> None:
    reads = _ScriptedReads([10, 3, 4])

    assert _all(blocking(reads)) == [10, 3, 4]
    assert reads.asked == [0, 10, 3, 4]


def test_blocking__an_empty_table_at_index_0__is_not_asked_for_at_once_again() -> None:
    reads = _ScriptedReads([0, 0, 2])

    assert _all(blocking(reads)) == [0, 2]
    assert reads.asked == [0, 1, 1, 2]  # never min_index 0 again: that would not block


def test_blocking__timeout_ends_the_iteration() -> None:
    reads = _ScriptedReads([1] * 1000)

    got = list(blocking(reads, timeout=0.0))

    assert got == [] and reads.asked == []


def test_import__the_sdk_alone_loads_no_server_module() -> None:
    code = "import sys, drover.sdk; print(sorted(m for m in sys.modules if m.startswith('drover.server')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)

    assert out.stdout.strip() == "[]"
