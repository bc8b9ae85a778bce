"""raw_exec ``user``: only a root agent switches users; any other refuses at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from drover.client.drivers import RawExecDriver, TaskSpec, raw_exec
from drover.client.errors import DriverConfigError


def as_user(user: str) -> TaskSpec:
    return TaskSpec(alloc_id="a1", name="t", driver="raw_exec", config={"command": "/bin/true"}, user=user)


def test_not_root__refused_with_a_message_saying_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raw_exec.os, "geteuid", lambda: 1000)
    with pytest.raises(
        DriverConfigError, match=r"user 'nobody'.*only when the agent runs as root \(it runs as uid 1000\)"
    ):
        RawExecDriver().start(as_user("nobody"), tmp_path / "t")
    assert not (tmp_path / "t").exists()  # refused before anything was made


def test_root__unknown_user_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raw_exec.os, "geteuid", lambda: 0)
    with pytest.raises(DriverConfigError, match="no such user on this node"):
        RawExecDriver().start(as_user("no-such-user-h7"), tmp_path / "t")
