"""The ACL settings of a server: flag -acl-enabled, config block ``acl { enabled = true }``."""

from __future__ import annotations

from pathlib import Path

import pytest

from drover.cli import main
from drover.server.config import ConfigError, ServerConfig, load_client_config, load_server_config

BASE = 'node_name = "s1"\ndata_dir = "/d"\n'


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_acl__default__off() -> None:
    assert load_server_config({"node_name": "s1", "data_dir": "/d"}, None).acl_enabled is False


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("server.hcl", BASE + "acl {\n  enabled = true\n}\n"),
        ("server.yaml", "node_name: s1\ndata_dir: /d\nacl:\n  enabled: true\n"),
        ("server.json", '{"node_name": "s1", "data_dir": "/d", "acl": {"enabled": true}}'),
    ],
    ids=["hcl", "yaml", "json"],
)
def test_acl__config_block__turns_acls_on(tmp_path: Path, name: str, text: str) -> None:
    assert load_server_config({}, _write(tmp_path, name, text)).acl_enabled is True


def test_acl__flag__overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.hcl", BASE + "acl {\n  enabled = false\n}\n")
    assert load_server_config({"acl_enabled": True}, path).acl_enabled is True


REFUSED = [
    (
        "unknown-key",
        BASE + "acl {\n  enabeld = true\n}\n",
        "unknown key 'acl.enabeld' (did you mean 'enabled'?)",
    ),
    ("not-a-bool", BASE + 'acl {\n  enabled = "yes"\n}\n', "key 'acl_enabled': expected true or false"),
    ("not-a-block", BASE + "acl = true\n", "key 'acl': expected one acl { ... } block"),
    ("two-blocks", BASE + "acl {\n enabled = true\n}\nacl {\n enabled = true\n}\n", "expected one acl"),
    ("given-twice", BASE + "acl_enabled = true\nacl {\n  enabled = true\n}\n", "acl.enabled is given twice"),
]


@pytest.mark.parametrize(("text", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_acl__bad_config__refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_server_config({}, _write(tmp_path, "s.hcl", text))
    assert message in str(caught.value)


def test_acl__client_config__has_no_acl_block(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.hcl", BASE + "acl {\n  enabled = true\n}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'acl\.enabled'"):
        load_client_config({}, path)


def test_acl__agent_flag__reaches_the_server_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[ServerConfig] = []
    import drover.server.agent as server_agent

    monkeypatch.setattr(server_agent, "run_server", lambda cfg: started.append(cfg) or 0)

    assert main(["agent", "-server", "-node-name", "s1", "-data-dir", "/d", "-acl-enabled"]) == 0
    assert [cfg.acl_enabled for cfg in started] == [True]


def test_acl__agent_flag_on_a_client__refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["agent", "-client", "-node-name", "c1", "-data-dir", "/d", "-acl-enabled"])

    assert code == 1
    assert capsys.readouterr().err.strip() == "Error: flag -acl-enabled does not apply to agent -client"
