"""Agent configuration: the same keys from command-line flags or from a ``-config`` file.

The dataclasses are the contract between the CLI (which fills them) and the agents (which
run them). Loading and checking lives in ``load_*`` below.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

import hcl2
import yaml

from drover.common.duration import parse_duration
from drover.common.tls import TLSError, TLSFiles, tls_files

DEFAULT_GRPC_PORT = 4646
DEFAULT_RAFT_PORT = 4647
# Metrics, leader and health over HTTP (drover/common/http_endpoint.py); 0 picks a free port.
DEFAULT_HTTP_PORT = 4649


@dataclass(frozen=True, slots=True)
class ServerConfig:
    node_name: str
    data_dir: str
    bind: str = "127.0.0.1"
    grpc_port: int = DEFAULT_GRPC_PORT
    raft_port: int = DEFAULT_RAFT_PORT
    http_port: int = DEFAULT_HTTP_PORT
    # The other servers' raft addresses, "host:port".
    peers: tuple[str, ...] = ()
    # The cluster key, the same file on every server: required with peers (the agent says
    # how to make one); a server without peers makes a random key of its own.
    raft_key_file: str = ""
    # Servers already in a running cluster, gRPC "host:port": a server that has never
    # been in one (no saved peer set) asks them to add it before it starts raft
    # (server/membership.py). Needs raft_key_file; with ACLs on, DROVER_TOKEN a management
    # token.
    join: tuple[str, ...] = ()
    # Autopilot (server/autopilot.py): the leader removes a server that has not answered
    # for longer than the threshold, never below a quorum of the configured size.
    autopilot_cleanup_dead_servers: bool = False
    autopilot_dead_server_threshold: str = "60s"
    # Raft log entries between snapshots (Nomad's raft_snapshot_threshold): each server
    # compacts its log into a snapshot once this many entries are applied past the last.
    # Lower means smaller logs and more frequent snapshot writes.
    raft_snapshot_threshold: int = 20_000
    # Leader-side worker threads (used once the scheduling pipeline lands).
    num_workers: int = 2
    log_json: bool = False
    log_level: str = "info"
    # Heartbeats (Nomad's defaults): durations like "10s", "5m".
    min_heartbeat_ttl: str = "10s"
    max_heartbeats_per_second: int = 50
    heartbeat_grace: str = "10s"
    failover_heartbeat_ttl: str = "5m"
    # Allocations one task group may ask for (Nomad's job_max_count idea, per group): the
    # scheduler holds every one of them in memory, so a count of 2**31-1 would take the
    # leader down. Jobs over it are refused naming the group's count.
    job_max_group_count: int = 10_000
    # ACLs (server/acl/): every API call needs a token that allows it. Config block
    # ``acl { enabled = true }``; flag -acl-enabled.
    acl_enabled: bool = False
    # TLS on the gRPC port: all three files, or none (plaintext). Config block
    # ``tls { ca_file cert_file key_file verify_https_client }``.
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # Refuse callers without a certificate from tls_ca_file (mTLS).
    tls_verify_https_client: bool = False
    # Events the event stream keeps for resuming streams (server/events/buffer.py),
    # Nomad's event_buffer_size (drover counts events, not batches).
    event_buffer_size: int = 4096
    # Garbage collection (server/gc/): Nomad's thresholds, durations like "1h". An object is
    # collected once it has been terminal (dead, down) for longer than its threshold; batch
    # jobs' evals wait longer, as in Nomad. The leader looks every gc_interval (Nomad's
    # job_gc_interval, 5m); `drover system gc` collects at once with every threshold 0.
    eval_gc_threshold: str = "1h"
    batch_eval_gc_threshold: str = "24h"
    job_gc_threshold: str = "4h"
    node_gc_threshold: str = "24h"
    deployment_gc_threshold: str = "1h"
    gc_interval: str = "5m"

    @property
    def tls(self) -> TLSFiles | None:
        return tls_files(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    node_name: str
    data_dir: str
    # Servers' gRPC addresses, "host:port".
    servers: tuple[str, ...] = ()
    # Where the client's HTTP port (metrics, health) listens; it checks no token, so
    # loopback unless told otherwise (docs/SECURITY.md).
    bind: str = "127.0.0.1"
    http_port: int = DEFAULT_HTTP_PORT
    datacenter: str = "dc1"
    node_class: str = ""
    # The node pool the node registers in ("" : "default"); jobs place only in their pool.
    node_pool: str = ""
    meta: dict[str, str] = field(default_factory=dict)
    log_json: bool = False
    log_level: str = "info"
    # raw_exec runs a job's command as this agent's own user (root under systemd), with no
    # isolation: whoever can submit a job then runs code here. Off unless set, as Nomad's.
    enable_raw_exec: bool = False
    # TLS to the servers: a CA means TLS; cert and key when the servers verify clients.
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""

    @property
    def tls(self) -> TLSFiles | None:
        return tls_files(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)


@dataclass(frozen=True, slots=True)
class DevConfig:
    grpc_port: int = DEFAULT_GRPC_PORT
    http_port: int = DEFAULT_HTTP_PORT
    # Empty: a fresh temporary directory, removed on exit.
    data_dir: str = ""
    log_json: bool = False
    log_level: str = "info"


class ConfigError(ValueError):
    """A bad agent configuration. The message is one line and names the offending key."""


_SERVER_REQUIRED = ("node_name", "data_dir")
_CLIENT_REQUIRED = ("node_name", "data_dir")
_LOG_LEVELS = ("debug", "info", "warning", "error")
# Nomad's spellings drover does not take, with what to write instead.
_NOMAD_ONLY_KEYS = {
    "plugin": "drover has no plugin blocks; for raw_exec write enable_raw_exec = true (or pass -enable-raw-exec)",
}
# Duration keys checked at load, so a bad value is refused naming its key before anything
# starts; the gc interval must be positive (a zero interval would spin the leader).
GC_DURATION_KEYS: Final = (
    "eval_gc_threshold",
    "batch_eval_gc_threshold",
    "job_gc_threshold",
    "node_gc_threshold",
    "deployment_gc_threshold",
    "gc_interval",
)
# Keys whose value lists "host:port" addresses; a string value is split on commas.
_ADDRESS_KEYS = frozenset({"peers", "servers", "join"})


def load_server_config(flags: Mapping[str, object], config_file: str | None) -> ServerConfig:
    """The server agent's configuration: ``config_file`` overlaid by the flags given."""
    return _load(ServerConfig, flags, config_file, required=_SERVER_REQUIRED)


def load_client_config(flags: Mapping[str, object], config_file: str | None) -> ClientConfig:
    """The client agent's configuration: ``config_file`` overlaid by the flags given."""
    return _load(ClientConfig, flags, config_file, required=_CLIENT_REQUIRED)


def load_dev_config(flags: Mapping[str, object], config_file: str | None) -> DevConfig:
    """The ``-dev`` agent's configuration: ``config_file`` overlaid by the flags given."""
    return _load(DevConfig, flags, config_file, required=())


def read_config_file(path: str) -> dict[str, object]:
    """The top-level mapping of an HCL (``.hcl``) or YAML (``.yaml``/``.yml``/``.json``) file."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".hcl", ".yaml", ".yml", ".json"):
        raise ConfigError(
            f"config file {path}: unsupported extension {ext!r} (use .hcl, .yaml, .yml or .json)"
        )
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    try:
        data = _parse_hcl(text) if ext == ".hcl" else yaml.safe_load(text)
    except Exception as exc:  # lark and yaml raise many types; all mean "does not parse"
        raise ConfigError(f"config file {path}: cannot parse: {_first_line(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping of keys to values")
    return {str(k): v for k, v in data.items()}


# ---------------------------------------------------------------------------------------


C = TypeVar("C", ServerConfig, ClientConfig, DevConfig)


def _load(
    cls: type[C], flags: Mapping[str, object], config_file: str | None, *, required: tuple[str, ...]
) -> C:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    merged: dict[str, object] = {}
    sources: list[tuple[str, Mapping[str, object]]] = []
    if config_file:
        sources.append((f"config file {config_file}", read_config_file(config_file)))
    # Flags come last so they override the file; None means "flag not given".
    sources.append(("flags", {k: v for k, v in flags.items() if v is not None}))
    for origin, values in sources:
        if origin != "flags":
            values = _flatten_blocks(values, origin, names)
        for key, raw in values.items():
            if key not in hints and origin == "flags":
                raise ConfigError(f"flag -{key.replace('_', '-')} does not apply to this agent (key {key!r})")
            if key in _NOMAD_ONLY_KEYS and key not in hints:
                raise ConfigError(f"{origin}: key {key!r}: {_NOMAD_ONLY_KEYS[key]}")
            if key not in hints:
                raise ConfigError(f"{origin}: unknown key {key!r}{_suggest(key, names)}")
            merged[key] = _coerce(key, raw, hints[key], origin)
    for key in required:
        if not merged.get(key):
            raise ConfigError(f"missing required key {key!r} (flag -{key.replace('_', '-')} or config file)")
    if "log_level" in merged and merged["log_level"] not in _LOG_LEVELS:
        raise ConfigError(f"key 'log_level': must be one of {', '.join(_LOG_LEVELS)}")
    for key in GC_DURATION_KEYS:
        if key in merged:
            _check_gc_duration(key, str(merged[key]))
    threshold = merged.get("raft_snapshot_threshold")
    if isinstance(threshold, int) and threshold < 1:
        raise ConfigError(f"key 'raft_snapshot_threshold': must be >= 1, got {threshold}")
    config = cls(**merged)  # type: ignore[arg-type]
    if not isinstance(config, DevConfig):
        _check_tls(config)
    return config


def _check_gc_duration(key: str, text: str) -> None:
    try:
        ns = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"key {key!r}: {exc}") from exc
    if ns < 0 or (key == "gc_interval" and ns == 0):
        raise ConfigError(f"key {key!r}: must be {'> 0' if key == 'gc_interval' else '>= 0'}, got {text!r}")


def _check_tls(config: ServerConfig | ClientConfig) -> None:
    """Half a TLS setting fails here, at load, naming the flag; the files are read later."""
    try:
        files = config.tls
    except TLSError as exc:
        raise ConfigError(str(exc)) from exc
    if not isinstance(config, ServerConfig):
        return
    if config.tls_verify_https_client and files is None:
        raise ConfigError("-tls-verify-client needs -tls-ca-file, -tls-cert-file and -tls-key-file")
    if files is not None and not files.has_identity:
        raise ConfigError(
            "-tls-ca-file on a server needs -tls-cert-file and -tls-key-file: a server presents a certificate"
        )


# Config-file blocks whose keys are fields named "<block>_<key>": ``acl { enabled = true }``
# is ``acl_enabled``, as Nomad's agent config nests them. A flag sets the field directly.
# ``ports`` names them the other way round, as Nomad's ``ports { http = 4646 }``:
# ``ports { http = 4649 }`` is ``http_port`` (flag -http-port).
_BLOCKS: Final = ("acl", "tls", "ports")


def _block_field(block: str, inner: str) -> str:
    return f"{inner}_port" if block == "ports" else f"{block}_{inner}"


def _block_keys(block: str, names: list[str]) -> list[str]:
    if block == "ports":
        return [n.removesuffix("_port") for n in names if n.endswith("_port")]
    return [n.removeprefix(f"{block}_") for n in names if n.startswith(f"{block}_")]


def _flatten_blocks(values: Mapping[str, object], origin: str, names: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, raw in values.items():
        if key not in _BLOCKS:
            out[key] = raw
            continue
        # HCL gives a list of one mapping per block; YAML and JSON a mapping.
        bodies = raw if isinstance(raw, list) else [raw]
        if len(bodies) != 1 or not isinstance(bodies[0], dict):
            raise ConfigError(
                f"{origin}: key {key!r}: expected one {key} {{ ... }} block, got {_describe(raw)}"
            )
        for inner, value in bodies[0].items():
            field_name = _block_field(key, str(inner))
            if field_name not in names:
                known = _block_keys(key, names)
                raise ConfigError(f"{origin}: unknown key '{key}.{inner}'{_suggest(str(inner), known)}")
            if field_name in values or field_name in out:
                raise ConfigError(f"{origin}: key {key}.{inner} is given twice")
            out[field_name] = value
    return out


def _coerce(key: str, raw: object, tp: object, origin: str) -> object:
    where = f"{origin}: key {key!r}"
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        raise ConfigError(f"{where}: expected true or false, got {_describe(raw)}")
    if tp is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            if key.endswith("_port") and not 0 <= raw <= 65535:
                raise ConfigError(f"{where}: port {raw} out of range 0-65535")
            if not key.endswith("_port") and raw < 0:
                raise ConfigError(f"{where}: must be >= 0, got {raw}")
            return raw
        raise ConfigError(f"{where}: expected an integer, got {_describe(raw)}")
    if tp is str:
        if isinstance(raw, str):
            return raw
        raise ConfigError(f"{where}: expected a string, got {_describe(raw)}")
    origin_tp = typing.get_origin(tp)
    if origin_tp is tuple:
        items = _string_list(raw, where)
        if key in _ADDRESS_KEYS:
            for item in items:
                _check_address(item, where)
        return items
    if origin_tp is dict:
        return _string_map(raw, where)
    raise AssertionError(f"config field {key!r} has unsupported type {tp!r}")  # pragma: no cover


def _string_list(raw: object, where: str) -> tuple[str, ...]:
    if isinstance(raw, str):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if isinstance(raw, list | tuple) and all(isinstance(item, str) for item in raw):
        return tuple(item.strip() for item in raw if item.strip())
    raise ConfigError(
        f"{where}: expected a list of strings or a comma-separated string, got {_describe(raw)}"
    )


def _string_map(raw: object, where: str) -> dict[str, str]:
    # An HCL block (``meta { rack = "r1" }``) parses to a list of one mapping per block.
    if isinstance(raw, list) and all(isinstance(item, dict) for item in raw):
        blocks: list[dict[object, object]] = raw
        raw = {k: v for block in blocks for k, v in block.items()}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of strings, got {_describe(raw)}")
    out: dict[str, str] = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ConfigError(f"{where}: value of {k!r} must be a string, got {_describe(v)}")
        out[str(k)] = str(v)
    return out


def _check_address(addr: str, where: str) -> None:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"{where}: {addr!r} is not a host:port address")


def _parse_hcl(text: str) -> object:
    options = hcl2.SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)
    return hcl2.loads(text, serialization_options=options)


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _suggest(key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key.replace("-", "_"), names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
