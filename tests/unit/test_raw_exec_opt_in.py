"""raw_exec is offered only when the operator turns it on, as in Nomad: ``-enable-raw-exec``,
``enable_raw_exec = true`` in the client config, or ``-dev``."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from drover.cli import main
from drover.client.clock import SystemClock
from drover.client.drivers import default_drivers
from drover.client.fingerprint import fingerprint
from drover.server.config import ConfigError, load_client_config
from tests.unit.test_client_core import FACTS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "config"


def test_drivers__raw_exec_off__only_mock_and_no_fingerprint() -> None:
    drivers = default_drivers(SystemClock(), raw_exec=False)
    assert sorted(drivers) == ["mock"]
    assert "driver.raw_exec" not in fingerprint(FACTS, "c1", drivers).attributes


def test_drivers__raw_exec_on__offered_and_fingerprinted() -> None:
    drivers = default_drivers(SystemClock(), raw_exec=True)
    assert sorted(drivers) == ["mock", "raw_exec"]
    assert fingerprint(FACTS, "c1", drivers).attributes["driver.raw_exec"] == "1"


def test_client_config__default__raw_exec_off() -> None:
    assert load_client_config({"node_name": "c1", "data_dir": "/d"}, None).enable_raw_exec is False


@pytest.mark.parametrize(
    ("name", "text"),
    [("client.hcl", "enable_raw_exec = true\n"), ("client.yaml", "enable_raw_exec: true\n")],
)
def test_client_config__enable_raw_exec_key__on(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(
        'node_name = "c1"\ndata_dir = "/d"\n' + text
        if name.endswith(".hcl")
        else "node_name: c1\ndata_dir: /d\n" + text
    )
    assert load_client_config({}, str(path)).enable_raw_exec is True


def test_client_config__nomad_plugin_block__refused_saying_what_to_write(tmp_path: Path) -> None:
    path = tmp_path / "client.hcl"
    path.write_text(
        'node_name = "c1"\ndata_dir = "/d"\nplugin "raw_exec" {\n  config {\n    enabled = true\n  }\n}\n'
    )
    with pytest.raises(ConfigError, match="enable_raw_exec = true"):
        load_client_config({}, str(path))


def test_deploy_client_configs__agree_and_keep_raw_exec_off() -> None:
    hcl = load_client_config({}, str(DEPLOY / "client.hcl"))
    yaml = load_client_config({}, str(DEPLOY / "client.yaml"))
    assert hcl == yaml
    assert hcl.enable_raw_exec is False


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A stand-in client agent module recording the config it is started with."""
    import sys

    seen: list[object] = []

    def run_client(cfg: object, **_kwargs: object) -> int:
        seen.append(cfg)
        return 0

    module = types.ModuleType("drover.client.agent")
    module.run_client = run_client  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "drover.client.agent", module)
    return seen


@pytest.mark.parametrize(
    ("flags", "enabled"), [([], False), (["-enable-raw-exec"], True)], ids=["off", "flag"]
)
def test_agent_client__enable_raw_exec_flag(started: list[object], flags: list[str], enabled: bool) -> None:
    code = main(["agent", "-client", "-node-name", "c1", "-data-dir", "/d", "-servers", "s:4646", *flags])
    assert code == 0
    [cfg] = started
    assert getattr(cfg, "enable_raw_exec") is enabled  # noqa: B009


def test_agent_server__enable_raw_exec__does_not_apply(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["agent", "-server", "-node-name", "s1", "-data-dir", "/d", "-enable-raw-exec"])
    assert code == 1
    assert "-enable-raw-exec does not apply" in capsys.readouterr().err
