"""The ``drover`` CLI run as an operator runs it, against a LocalCluster's servers."""

from __future__ import annotations

import os
import subprocess
import sys

from deploy.cluster import LocalCluster


def run_cli(cluster: LocalCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``drover <args>`` in its own process, DROVER_ADDR naming every server; stdin closed,
    so a command that would ask for confirmation fails instead of waiting for ever."""
    return subprocess.run(
        [sys.executable, "-m", "drover.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "DROVER_ADDR": ",".join(cluster.grpc_addresses)},
    )
