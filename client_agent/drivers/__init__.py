"""Task drivers: ``mock`` (a timer) and ``raw_exec`` (a real process group)."""

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


def default_drivers(clock: Clock) -> dict[str, Driver]:
    """Every driver this agent offers, by name (fingerprinted as ``driver.<name>=1``)."""
    return {"mock": MockDriver(clock), "raw_exec": RawExecDriver()}
