"""What this host offers: resources and attributes, as the ``Node`` the agent registers.

``probe_host`` reads the machine (psutil, platform, socket) once; ``fingerprint`` and
``build_node`` are pure functions of what it read, so they are tested with made-up hosts.
"""

from __future__ import annotations

import platform
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import psutil

from drover.v1 import structs_pb2

__all__ = [
    "MAX_DYNAMIC_PORT",
    "MIN_DYNAMIC_PORT",
    "Fingerprint",
    "HostFacts",
    "NodeSettings",
    "build_node",
    "fingerprint",
    "probe_host",
]

MIN_DYNAMIC_PORT: Final = 20000
MAX_DYNAMIC_PORT: Final = 32000
# A core whose clock cannot be read (containers, some VMs) counts as this many MHz.
FALLBACK_MHZ_PER_CORE: Final = 1000
AGENT_VERSION: Final = "0.1.0"
_MIB: Final = 1024 * 1024
_ARCH_NAMES: Final = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "i686": "386",
}


class NodeSettings(Protocol):
    """The agent settings a node registration needs (``ClientConfig`` has them)."""

    @property
    def node_name(self) -> str: ...
    @property
    def datacenter(self) -> str: ...
    @property
    def node_class(self) -> str: ...
    @property
    def node_pool(self) -> str: ...
    @property
    def meta(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class HostFacts:
    hostname: str
    kernel_name: str
    kernel_version: str
    machine: str
    os_name: str
    os_version: str
    cores: int
    # 0 when unknown.
    mhz_per_core: float
    memory_bytes: int
    disk_free_bytes: int
    disk_total_bytes: int
    address: str


@dataclass(frozen=True, slots=True)
class Fingerprint:
    cpu_mhz: int
    memory_mb: int
    disk_mb: int
    attributes: Mapping[str, str]
    address: str


def fingerprint(facts: HostFacts, node_name: str, drivers: Iterable[str]) -> Fingerprint:
    """Resources and attributes from ``facts``; every driver is announced as ``driver.<name>=1``."""
    cores = max(1, facts.cores)
    mhz = int(facts.mhz_per_core) if facts.mhz_per_core > 0 else FALLBACK_MHZ_PER_CORE
    cpu_mhz = cores * mhz
    attributes = {
        "kernel.name": facts.kernel_name,
        "kernel.version": facts.kernel_version,
        "os.name": facts.os_name,
        "os.version": facts.os_version,
        "cpu.arch": _ARCH_NAMES.get(facts.machine.lower(), facts.machine.lower()),
        "cpu.numcores": str(cores),
        "cpu.frequency": str(mhz),
        "cpu.totalcompute": str(cpu_mhz),
        "memory.totalbytes": str(facts.memory_bytes),
        "unique.storage.bytesfree": str(facts.disk_free_bytes),
        "unique.storage.bytestotal": str(facts.disk_total_bytes),
        "unique.hostname": facts.hostname,
        "unique.name": node_name,
        "unique.network.ip-address": facts.address,
        "drover.version": AGENT_VERSION,
    }
    for name in sorted(drivers):
        attributes[f"driver.{name}"] = "1"
    return Fingerprint(
        cpu_mhz=cpu_mhz,
        memory_mb=facts.memory_bytes // _MIB,
        disk_mb=facts.disk_free_bytes // _MIB,
        attributes=attributes,
        address=facts.address,
    )


def build_node(node_id: str, secret_id: str, settings: NodeSettings, fp: Fingerprint) -> structs_pb2.Node:
    """The registration: status ready, eligible, with this host's fingerprint."""
    return structs_pb2.Node(
        id=node_id,
        secret_id=secret_id,
        name=settings.node_name,
        datacenter=settings.datacenter or "dc1",
        node_class=settings.node_class,
        node_pool=settings.node_pool,
        status="ready",
        scheduling_eligibility="eligible",
        attributes=dict(fp.attributes),
        meta=dict(settings.meta),
        address=fp.address,
        resources=structs_pb2.NodeResources(
            cpu_mhz=fp.cpu_mhz,
            memory_mb=fp.memory_mb,
            disk_mb=fp.disk_mb,
            min_dynamic_port=MIN_DYNAMIC_PORT,
            max_dynamic_port=MAX_DYNAMIC_PORT,
        ),
    )


def probe_host(data_dir: str, servers: Sequence[str] = ()) -> HostFacts:
    """Read this machine. ``data_dir`` must exist (its filesystem is the node's disk)."""
    freq = None
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError, RuntimeError):
        freq = None
    mhz = 0.0
    if freq is not None:
        mhz = freq.max if freq.max > 0 else freq.current
    disk = psutil.disk_usage(data_dir)
    os_name, os_version = _os_release()
    return HostFacts(
        hostname=socket.gethostname(),
        kernel_name=platform.system().lower(),
        kernel_version=platform.release(),
        machine=platform.machine(),
        os_name=os_name,
        os_version=os_version,
        cores=psutil.cpu_count(logical=True) or 1,
        mhz_per_core=mhz,
        memory_bytes=psutil.virtual_memory().total,
        disk_free_bytes=disk.free,
        disk_total_bytes=disk.total,
        address=_local_address(servers),
    )


def _os_release() -> tuple[str, str]:
    try:
        info = platform.freedesktop_os_release()
        return info.get("ID", platform.system().lower()), info.get("VERSION_ID", "")
    except OSError:
        return platform.system().lower(), platform.release()


def _local_address(servers: Sequence[str]) -> str:
    """The local IP that routes to the first server (a UDP connect sends no packet)."""
    host = servers[0].rsplit(":", 1)[0].strip("[]") if servers else "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, 9))
            return str(sock.getsockname()[0])
    except OSError:
        return "127.0.0.1"
