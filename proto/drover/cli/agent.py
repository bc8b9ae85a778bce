"""``drover agent``: run a dev, server or client agent in this process."""

from __future__ import annotations

import argparse
from typing import Final

from drover.cli._args import Subcommands, add_command, flag, parse_meta
from drover.cli._errors import CLIError
from drover.server.config import GC_DURATION_KEYS, load_client_config, load_dev_config, load_server_config

__all__ = ["register"]


def register(top: Subcommands) -> None:
    p = add_command(top, "agent", _cmd_agent, "run a server, client or dev agent")
    mode = p.add_mutually_exclusive_group(required=True)
    for name in ("dev", "server", "client"):
        mode.add_argument(f"-{name}", f"--{name}", dest="mode", action="store_const", const=name)
    flag(p, "config", metavar="FILE", help="HCL (.hcl) or YAML (.yaml/.yml/.json) config file")
    flag(p, "node-name")
    flag(p, "data-dir")
    flag(p, "bind")
    flag(p, "grpc-port", type=int)
    flag(p, "raft-port", type=int)
    flag(p, "http-port", type=int, help="metrics, leader and health over HTTP (4649; 0: any free port)")
    flag(p, "peers", help="other servers' raft addresses, comma-separated")
    flag(p, "raft-key-file")
    flag(
        p,
        "join",
        metavar="ADDR[,ADDR]",
        help="server: join a running cluster through these servers' gRPC addresses (retries until in)",
    )
    flag(
        p,
        "autopilot-cleanup-dead-servers",
        action="store_true",
        default=None,
        help="server: the leader removes a server silent longer than the threshold (never below quorum)",
    )
    flag(p, "autopilot-dead-server-threshold", metavar="DURATION", help="server: see above (60s)")
    flag(p, "servers", help="servers' gRPC addresses, comma-separated")
    flag(p, "datacenter")
    flag(p, "node-class")
    flag(p, "node-pool", help='client: the node pool this node is in ("default")')
    flag(p, "meta", action="append", metavar="KEY=VALUE", help="client node metadata (repeatable)")
    flag(
        p,
        "enable-raw-exec",
        action="store_true",
        default=None,
        help="client: offer the raw_exec driver (runs job commands unisolated as this agent's user)",
    )
    flag(p, "num-workers", type=int)
    flag(p, "raft-snapshot-threshold", type=int, help="server: raft entries between log snapshots (20000)")
    flag(p, "min-heartbeat-ttl", metavar="DURATION", help="shortest client heartbeat TTL (10s)")
    flag(p, "max-heartbeats-per-second", type=int, help="heartbeat rate the TTL scales to (50)")
    flag(p, "heartbeat-grace", metavar="DURATION", help="extra wait before a node is marked down (10s)")
    flag(p, "failover-heartbeat-ttl", metavar="DURATION", help="TTL every node gets from a new leader (5m)")
    flag(p, "job-max-group-count", type=int, help="the largest count a task group may ask for (10000)")
    for name, default in (
        ("eval-gc-threshold", "1h"),
        ("batch-eval-gc-threshold", "24h"),
        ("job-gc-threshold", "4h"),
        ("node-gc-threshold", "24h"),
        ("deployment-gc-threshold", "1h"),
    ):
        flag(p, name, metavar="DURATION", help=f"server: collect what is terminal for longer ({default})")
    flag(p, "gc-interval", metavar="DURATION", help="server: how often the leader collects garbage (5m)")
    flag(p, "log-json", action="store_true", default=None)
    flag(
        p,
        "acl-enabled",
        action="store_true",
        default=None,
        help="server: every API call needs an ACL token that allows it (config: acl { enabled = true })",
    )
    flag(p, "log-level", choices=("debug", "info", "warning", "error"))
    flag(p, "tls-ca-file", metavar="FILE", help="CA of the cluster's certificates (PEM): gRPC over TLS")
    flag(p, "tls-cert-file", metavar="FILE", help="this agent's certificate (PEM), signed by the CA")
    flag(p, "tls-key-file", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument(
        "-tls-verify-client",
        "--tls-verify-client",
        dest="tls_verify_https_client",
        action="store_true",
        default=None,
        help="server: refuse callers without a certificate from the CA (mTLS)",
    )


_AGENT_KEYS: Final = {
    "dev": ("grpc_port", "http_port", "data_dir", "log_json", "log_level"),
    "server": (
        "node_name",
        "data_dir",
        "bind",
        "grpc_port",
        "raft_port",
        "http_port",
        "peers",
        "raft_key_file",
        "join",
        "autopilot_cleanup_dead_servers",
        "autopilot_dead_server_threshold",
        "raft_snapshot_threshold",
        "num_workers",
        "min_heartbeat_ttl",
        "max_heartbeats_per_second",
        "heartbeat_grace",
        "failover_heartbeat_ttl",
        "job_max_group_count",
        *GC_DURATION_KEYS,
        "acl_enabled",
        "log_json",
        "log_level",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "tls_verify_https_client",
    ),
    "client": (
        "node_name",
        "data_dir",
        "servers",
        "bind",
        "http_port",
        "datacenter",
        "node_class",
        "node_pool",
        "meta",
        "enable_raw_exec",
        "log_json",
        "log_level",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
    ),
}
_ALL_AGENT_KEYS: Final = frozenset(k for keys in _AGENT_KEYS.values() for k in keys)
# Flags whose spelling is not their config key's (the key keeps Nomad's name).
_FLAG_SPELLINGS: Final = {"tls_verify_https_client": "tls-verify-client"}


def _cmd_agent(args: argparse.Namespace) -> int:
    mode: str = args.mode
    flags: dict[str, object] = {}
    for key in sorted(_ALL_AGENT_KEYS):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in _AGENT_KEYS[mode]:
            spelling = _FLAG_SPELLINGS.get(key, key.replace("_", "-"))
            raise CLIError(f"flag -{spelling} does not apply to agent -{mode}")
        flags[key] = parse_meta(value) if key == "meta" else value
    # Imported here: the agents pull in raft and the drivers, which other commands never need.
    rc: int
    if mode == "dev":
        from drover.server.agent import run_dev  # type: ignore[import-not-found, unused-ignore]

        rc = run_dev(load_dev_config(flags, args.config))
    elif mode == "server":
        from drover.server.agent import run_server  # type: ignore[import-not-found, unused-ignore]

        rc = run_server(load_server_config(flags, args.config))
    else:
        from drover.client.agent import run_client  # type: ignore[import-not-found, unused-ignore]

        rc = run_client(load_client_config(flags, args.config))
    return rc
