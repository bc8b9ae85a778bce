"""``python -m tests.bench._agent agent -server ...``: drover's agent, for the benchmark's cluster.

It runs ``drover.cli.main`` unchanged, plus the benchmark's watchdog: should the benchmark
process die without stopping its cluster, each agent shuts itself down (SIGTERM to itself,
which the agent handles cleanly) once its parent is gone or its lifetime is over. The
agents run in their own sessions, so nothing else would stop them after a SIGKILL.
"""

from __future__ import annotations

import os
import signal

from drover.cli import main
from tests.bench._procs import start_watchdog


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    start_watchdog(_terminate_self)
    raise SystemExit(main())
