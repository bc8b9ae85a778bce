"""``python -m tests.cluster.power_loss_agent agent -server ...``: a server agent whose raft
journal keeps un-synced writes in memory (tests/fixtures/power_loss.py); SIGUSR2 is its
power switch: the process ends at the journal's next write or sync (within 0.3 s if it is
idle), and only what the journal synced is on disk, with at most a torn tail.

Test-only, like tests/chaos/fault_agent.py: the ordinary ``drover.cli`` entry point with
the storage installed first. ``DROVER_TEST_DISK=lying`` gives it a disk whose sync writes
nothing (the must-fail case). Product code reads neither the signal nor the variable.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Final

from drover.server.raft import durable_journal
from tests.fixtures.power_loss import PowerLossStorage

POWER_OFF_SIGNAL: Final = signal.SIGUSR2
# The exit status a powered-off agent ends with, so the test can tell it from a crash.
POWER_OFF_EXIT: Final = 86
DISK_ENV: Final = "DROVER_TEST_DISK"


def main() -> int:
    store = PowerLossStorage(lying=os.environ.get(DISK_ENV) == "lying")
    durable_journal.set_storage(store)

    def power_off(_signum: int, _frame: FrameType | None) -> None:
        store.power_off(POWER_OFF_EXIT)

    signal.signal(POWER_OFF_SIGNAL, power_off)
    from drover.cli import main as agent_main

    return agent_main()


if __name__ == "__main__":
    sys.exit(main())
