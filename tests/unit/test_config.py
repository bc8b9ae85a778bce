"""Agent configuration: flags over file, HCL and YAML files, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from drover.server.config import (
    ClientConfig,
    ConfigError,
    DevConfig,
    ServerConfig,
    load_client_config,
    load_dev_config,
    load_server_config,
)

SERVER_HCL = """
# a server
node_name     = "s1"
data_dir      = "/var/lib/drover"
bind          = "10.0.0.1"
grpc_port     = 5646
raft_port     = 5647
peers         = ["10.0.0.2:5647", "10.0.0.3:5647"]
raft_key_file = "/etc/drover/raft.key"
log_json      = true
"""

SERVER_YAML = """
node_name: s1
data_dir: /var/lib/drover
bind: 10.0.0.1
grpc_port: 5646
raft_port: 5647
peers: 10.0.0.2:5647, 10.0.0.3:5647
raft_key_file: /etc/drover/raft.key
log_json: true
"""

EXPECTED_SERVER = ServerConfig(
    node_name="s1",
    data_dir="/var/lib/drover",
    bind="10.0.0.1",
    grpc_port=5646,
    raft_port=5647,
    peers=("10.0.0.2:5647", "10.0.0.3:5647"),
    raft_key_file="/etc/drover/raft.key",
    log_json=True,
)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------------------
# Sources and precedence


def test_server__flags_only() -> None:
    cfg = load_server_config({"node_name": "s1", "data_dir": "/d", "peers": "a:1, b:2,"}, None)
    assert cfg == ServerConfig(node_name="s1", data_dir="/d", peers=("a:1", "b:2"))


@pytest.mark.parametrize(
    ("name", "text"),
    [("server.hcl", SERVER_HCL), ("server.yaml", SERVER_YAML), ("server.yml", SERVER_YAML)],
    ids=["hcl", "yaml", "yml"],
)
def test_server__file_only(tmp_path: Path, name: str, text: str) -> None:
    assert load_server_config({}, write(tmp_path, name, text)) == EXPECTED_SERVER


def test_server__json_file_is_read_as_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "s.json", '{"node_name": "s1", "data_dir": "/d", "grpc_port": 1}')
    assert load_server_config({}, path) == ServerConfig(node_name="s1", data_dir="/d", grpc_port=1)


def test_server__flags_override_file(tmp_path: Path) -> None:
    path = write(tmp_path, "server.hcl", SERVER_HCL)
    cfg = load_server_config({"node_name": "s9", "grpc_port": 7000, "peers": "x:1", "bind": None}, path)
    assert cfg.node_name == "s9"
    assert cfg.grpc_port == 7000
    assert cfg.peers == ("x:1",)
    # A flag left unset (None) does not hide the file's value.
    assert cfg.bind == "10.0.0.1"
    assert cfg.raft_port == 5647


def test_server__required_keys_may_come_from_file(tmp_path: Path) -> None:
    path = write(tmp_path, "server.hcl", 'data_dir = "/d"\n')
    assert load_server_config({"node_name": "s1"}, path).data_dir == "/d"


def test_client__hcl_meta_block_and_servers_string(tmp_path: Path) -> None:
    text = """
node_name = "c1"
data_dir  = "/d"
servers   = "10.0.0.1:4646,10.0.0.2:4646"
datacenter = "east"
meta {
  rack = "r1"
  gen  = 3
}
"""
    cfg = load_client_config({}, write(tmp_path, "client.hcl", text))
    assert cfg == ClientConfig(
        node_name="c1",
        data_dir="/d",
        servers=("10.0.0.1:4646", "10.0.0.2:4646"),
        datacenter="east",
        meta={"rack": "r1", "gen": "3"},
    )


def test_client__meta_flag_replaces_file_meta(tmp_path: Path) -> None:
    path = write(tmp_path, "client.yaml", "node_name: c1\ndata_dir: /d\nmeta: {rack: r1}\n")
    assert load_client_config({"meta": {"zone": "z"}}, path).meta == {"zone": "z"}


def test_dev__defaults_and_port() -> None:
    assert load_dev_config({}, None) == DevConfig()
    assert load_dev_config({"grpc_port": 0}, None).grpc_port == 0


def test_empty_yaml_file_is_empty_config(tmp_path: Path) -> None:
    assert load_dev_config({}, write(tmp_path, "dev.yaml", "")) == DevConfig()


# ---------------------------------------------------------------------------------------
# Errors name the key


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        ({"data_dir": "/d"}, "node_name"),
        ({"node_name": "s1"}, "data_dir"),
        ({"node_name": "", "data_dir": "/d"}, "node_name"),
    ],
    ids=["no-node-name", "no-data-dir", "empty-node-name"],
)
def test_server__missing_required_key(flags: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_server_config(flags, None)


def test_client__missing_required_key() -> None:
    with pytest.raises(ConfigError, match="'data_dir'"):
        load_client_config({"node_name": "c1"}, None)


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("s.hcl", 'node_name = "s1"\ndata_dir = "/d"\ngrpc_port = "4646"\n', "grpc_port"),
        ("s.yaml", "node_name: s1\ndata_dir: /d\nlog_json: yes please\n", "log_json"),
        ("s.yaml", "node_name: s1\ndata_dir: /d\nraft_port: 70000\n", "raft_port"),
        ("s.yaml", "node_name: s1\ndata_dir: /d\npeers: [1, 2]\n", "peers"),
        ("s.yaml", "node_name: s1\ndata_dir: /d\npeers: [nohostport]\n", "peers"),
        ("s.yaml", "node_name: 7\ndata_dir: /d\n", "node_name"),
        ("s.yaml", "node_name: s1\ndata_dir: /d\nlog_level: loud\n", "log_level"),
        ("s.yaml", "node_name: s1\ndata_dir: /d\nnum_workers: true\n", "num_workers"),
    ],
    ids=[
        "hcl-port-string",
        "bool-string",
        "port-range",
        "peers-ints",
        "peers-no-port",
        "name-int",
        "level",
        "bool-int",
    ],
)
def test_server__wrong_type_names_key(tmp_path: Path, name: str, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'") as info:
        load_server_config({}, write(tmp_path, name, text))
    assert "\n" not in str(info.value)


def test_unknown_key_in_file_names_key_and_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, "s.hcl", 'node_name = "s1"\ndata_dir = "/d"\ngrpc-port = 1\n')
    with pytest.raises(ConfigError, match=r"unknown key 'grpc-port' \(did you mean 'grpc_port'\?\)"):
        load_server_config({}, path)


def test_unknown_key_in_flags() -> None:
    with pytest.raises(ConfigError, match="'servers'"):
        load_server_config({"node_name": "s1", "data_dir": "/d", "servers": "a:1"}, None)


def test_dev__rejects_server_keys() -> None:
    with pytest.raises(ConfigError, match="'node_name'"):
        load_dev_config({"node_name": "x"}, None)


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("s.hcl", 'node_name = "s1"\ndata_dir = \n', "cannot parse"),
        ("s.yaml", "node_name: [unclosed\n", "cannot parse"),
        ("s.yaml", "- a\n- b\n", "top level must be a mapping"),
        ("s.toml", "node_name = 's1'\n", "unsupported extension"),
    ],
    ids=["hcl-syntax", "yaml-syntax", "yaml-list", "extension"],
)
def test_bad_file_is_one_line_error(tmp_path: Path, name: str, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        load_server_config({}, write(tmp_path, name, text))
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_server_config({}, str(tmp_path / "nope.hcl"))


# ---------------------------------------------------------------------------------------
# TLS: the ``tls`` block, its flags, and half settings refused at load

TLS_HCL = """
node_name = "s1"
data_dir  = "/d"
tls {
  ca_file             = "/etc/drover/ca.pem"
  cert_file           = "/etc/drover/server.pem"
  key_file            = "/etc/drover/server-key.pem"
  verify_https_client = true
}
"""

TLS_YAML = """
node_name: s1
data_dir: /d
tls:
  ca_file: /etc/drover/ca.pem
  cert_file: /etc/drover/server.pem
  key_file: /etc/drover/server-key.pem
  verify_https_client: true
"""


@pytest.mark.parametrize(("name", "text"), [("s.hcl", TLS_HCL), ("s.yaml", TLS_YAML)], ids=["hcl", "yaml"])
def test_server__tls_block(tmp_path: Path, name: str, text: str) -> None:
    cfg = load_server_config({}, write(tmp_path, name, text))
    assert (cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_verify_https_client) == (
        "/etc/drover/ca.pem",
        "/etc/drover/server.pem",
        "/etc/drover/server-key.pem",
        True,
    )
    assert cfg.tls is not None and cfg.tls.has_identity


def test_server__tls_flags_override_block(tmp_path: Path) -> None:
    cfg = load_server_config({"tls_ca_file": "/other/ca.pem"}, write(tmp_path, "s.hcl", TLS_HCL))
    assert cfg.tls_ca_file == "/other/ca.pem" and cfg.tls_cert_file == "/etc/drover/server.pem"


def test_server__no_tls__plaintext() -> None:
    assert load_server_config({"node_name": "s1", "data_dir": "/d"}, None).tls is None


def test_tls_block__unknown_key_named(tmp_path: Path) -> None:
    text = 'node_name = "s1"\ndata_dir = "/d"\ntls {\n  ca_fil = "x"\n}\n'
    with pytest.raises(ConfigError, match=r"unknown key 'tls\.ca_fil' \(did you mean 'ca_file'\?\)"):
        load_server_config({}, write(tmp_path, "s.hcl", text))


def test_client__tls_block_without_verify(tmp_path: Path) -> None:
    text = 'node_name = "c1"\ndata_dir = "/d"\ntls {\n  ca_file = "/ca.pem"\n}\n'
    cfg = load_client_config({}, write(tmp_path, "c.hcl", text))
    assert cfg.tls is not None and cfg.tls.ca_file == "/ca.pem" and not cfg.tls.has_identity


def test_client__verify_https_client__does_not_apply(tmp_path: Path) -> None:
    text = (
        'node_name = "c1"\ndata_dir = "/d"\ntls {\n  ca_file = "/ca.pem"\n  verify_https_client = true\n}\n'
    )
    with pytest.raises(ConfigError, match=r"unknown key 'tls\.verify_https_client'"):
        load_client_config({}, write(tmp_path, "c.hcl", text))


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"tls_ca_file": "ca", "tls_cert_file": "c"}, "-tls-cert-file was given without -tls-key-file"),
        ({"tls_cert_file": "c", "tls_key_file": "k"}, "-tls-cert-file was given without -tls-ca-file"),
        ({"tls_ca_file": "ca"}, "a server presents a certificate"),
        ({"tls_verify_https_client": True}, "-tls-verify-client needs -tls-ca-file"),
    ],
    ids=["cert-without-key", "cert-without-ca", "server-without-identity", "verify-without-tls"],
)
def test_server__half_a_tls_setting__one_line_naming_the_flags(flags: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        load_server_config({"node_name": "s1", "data_dir": "/d", **flags}, None)
    assert "\n" not in str(info.value)


def test_client__ca_only_is_enough() -> None:
    cfg = load_client_config({"node_name": "c1", "data_dir": "/d", "tls_ca_file": "ca"}, None)
    assert cfg.tls is not None and not cfg.tls.has_identity


def test_server__raft_snapshot_threshold__flag_file_and_bad_value(tmp_path: Path) -> None:
    from drover.cli._parser import build_parser

    args = build_parser().parse_args(["agent", "-server", "-raft-snapshot-threshold", "500"])
    assert args.raft_snapshot_threshold == 500
    assert load_server_config({"node_name": "s1", "data_dir": "/d"}, None).raft_snapshot_threshold == 20_000
    path = write(tmp_path, "s.hcl", 'node_name = "s1"\ndata_dir = "/d"\nraft_snapshot_threshold = 1000\n')
    assert load_server_config({}, path).raft_snapshot_threshold == 1000
    with pytest.raises(ConfigError, match="key 'raft_snapshot_threshold': must be >= 1, got 0"):
        load_server_config({"raft_snapshot_threshold": 0}, path)
