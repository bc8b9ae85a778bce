"""Task drivers: ``mock`` (a timer) and ``raw_exec`` (a real process group, opt-in)."""

from __future__ import annotations

from drover.client.clock import Clock
from drover.client.drivers.base import Driver, ExitResult, TaskHandle, TaskSpec, parse_config_json
from drover.client.drivers.mock import MockDriver
from drover.client.drivers.raw_exec import RawExecDriver

__all__ = [
    "Driver",
    "ExitResult",
    "MockDriver",
    "RawExecDriver",
    "TaskHandle",
    "TaskSpec",
    "default_drivers",
    "parse_config_json",
]


def default_drivers(clock: Clock, *, raw_exec: bool) -> dict[str, Driver]:
    """The drivers this agent offers, by name (fingerprinted as ``driver.<name>=1``).

    ``raw_exec`` runs a job's command unisolated as the agent's user, so it is offered only
    when the operator enabled it (``-enable-raw-exec``, ``enable_raw_exec = true``, or
    ``-dev``), as in Nomad. A node without it is never picked for a raw_exec task, and a
    raw_exec task that reaches it anyway fails with "driver not available".
    """
    drivers: dict[str, Driver] = {"mock": MockDriver(clock)}
    if raw_exec:
        drivers["raw_exec"] = RawExecDriver()
    return drivers
