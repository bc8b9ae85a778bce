"""The example server configs in deploy/config/ load, and each cluster's files agree on its members.

Membership is static (deploy/RUNBOOK.md): every server must list every other member, or two
servers could disagree on what a majority is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from drover.server.config import load_server_config

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "config"
CLUSTERS = {
    "three-servers": sorted(CONFIG.glob("server[0-9].hcl")),
    "five-servers": sorted((CONFIG / "five-servers").glob("server[0-9].hcl")),
}


@pytest.mark.parametrize(("name", "files"), list(CLUSTERS.items()), ids=list(CLUSTERS))
def test_deploy_configs__every_server_lists_every_other_member(name: str, files: list[Path]) -> None:
    assert len(files) in (3, 5), f"{name}: {files}"
    configs = [load_server_config({}, str(path)) for path in files]
    members = {f"{c.bind}:{c.raft_port}" for c in configs}
    assert len(members) == len(configs), f"{name}: two servers share a raft address"
    assert len({c.node_name for c in configs}) == len(configs)
    for config in configs:
        assert set(config.peers) == members - {f"{config.bind}:{config.raft_port}"}, config.node_name
        assert config.raft_key_file, f"{config.node_name}: a server with peers needs raft_key_file"
