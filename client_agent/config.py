"""The client agent's settings: what it reads from its configuration, and its tunables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from drover.client.fingerprint import NodeSettings
from drover.common.tls import TLSFiles

__all__ = ["DEFAULT_TTL_NS", "AgentTuning", "ClientSettings", "EmbeddedSettings", "ProcessSettings"]

DEFAULT_TTL_NS: Final = 10_000_000_000


class ClientSettings(NodeSettings, Protocol):
    """What the agent reads from its configuration (``drover.server.config.ClientConfig`` fits):
    what its node registration announces (``NodeSettings``: name, datacenter, class, meta)
    and, on top, where it keeps state, which servers it asks and how it logs."""

    @property
    def data_dir(self) -> str: ...
    @property
    def servers(self) -> Sequence[str]: ...
    @property
    def log_json(self) -> bool: ...
    @property
    def log_level(self) -> str: ...
    @property
    def enable_raw_exec(self) -> bool: ...


class ProcessSettings(ClientSettings, Protocol):
    """What the ``drover agent -client`` process reads on top: how it reaches the servers,
    and where its HTTP port (metrics, health) listens."""

    @property
    def tls(self) -> TLSFiles | None: ...
    @property
    def bind(self) -> str: ...
    @property
    def http_port(self) -> int: ...


@dataclass(frozen=True, slots=True)
class AgentTuning:
    """Intervals and timeouts; the defaults are for production, tests shorten them."""

    # How often queued status updates are sent (Nomad's allocSync tick).
    sync_interval_s: float = 0.2
    # How long the server may hold a blocking GetClientAllocs.
    watch_wait_s: float = 30.0
    # Deadline of every other RPC.
    rpc_timeout_s: float = 5.0
    # Retry backoff after a failed call: full jitter between base and the capped doubling.
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 5.0
    # How often stop_on_client_after is checked.
    watchdog_interval_s: float = 0.1
    # The heartbeat TTL assumed until a server sends one.
    default_ttl_ns: int = DEFAULT_TTL_NS
    # stop(): how long tasks get to die beyond their own kill_timeout.
    stop_grace_s: float = 5.0


@dataclass(frozen=True, slots=True)
class EmbeddedSettings:
    """Settings for an agent started in-process (``start_embedded_client``)."""

    node_name: str
    data_dir: str
    servers: tuple[str, ...]
    datacenter: str = "dc1"
    node_class: str = ""
    node_pool: str = ""
    meta: Mapping[str, str] = field(default_factory=dict)
    log_json: bool = False
    log_level: str = "info"
    enable_raw_exec: bool = False
