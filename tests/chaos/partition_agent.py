"""``python -m tests.chaos.partition_agent agent ...``: the drover agent, partitionable.

The ordinary ``drover.cli`` entry point with tests/chaos/partition.py's raft transport
hook installed first (when ``DROVER_CHAOS_PARTITION_FILE`` is set). Test-only.
"""

from __future__ import annotations

import os
import sys

from tests.chaos.partition import ENV, install


def main() -> int:
    path = os.environ.get(ENV)
    if path:
        install(path)
    from drover.cli import main as agent_main

    return agent_main()


if __name__ == "__main__":
    sys.exit(main())
