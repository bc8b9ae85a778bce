"""``python -m tests.chaos.fault_agent agent ...``: the drover agent with the chaos suite's
fault hooks, test-only.

The ordinary ``drover.cli`` entry point, with each hook whose control file is named in the
environment installed first:

* ``DROVER_CHAOS_PARTITION_FILE``: raft partitions (tests/chaos/partition.py);
* ``DROVER_CHAOS_DISAGREE_FILE``: plan disagreements, nodes the plan applier sees shrunk
  (tests/chaos/disagreement.py).

Product code reads neither variable: only this wrapper does, and only the tests start it.
"""

from __future__ import annotations

import os
import sys

from tests.chaos import disagreement, partition


def main() -> int:
    if path := os.environ.get(partition.ENV):
        partition.install(path)
    if path := os.environ.get(disagreement.ENV):
        disagreement.install(path)
    from drover.cli import main as agent_main

    return agent_main()


if __name__ == "__main__":
    sys.exit(main())
