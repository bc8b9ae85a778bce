"""The ``drover`` command line: agents, jobs, nodes, evals, allocs and operator commands.

Flags are Nomad-style single-dash words (``-address``, ``-json``); the double-dash spelling
works too, as does ``-flag=value``. Common flags go after the command: ``drover job status
-json web``.

Contract for scripts: expected failures (bad job file, unknown ID, server errors, no leader
after retries) exit 1 with exactly one line ``Error: <message>`` on stderr and nothing on
stdout after it; argparse usage errors exit 2. ``-json`` prints protobuf messages as
``MessageToDict(msg, preserving_proto_field_name=True)``: snake_case keys as in the proto,
64-bit integers as strings, default values omitted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import grpc
from drover.v1 import api_pb2, raft_pb2, structs_pb2
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError, Message

from scheduler.structs import Job
from server.codec import to_proto
from server.config import ConfigError, load_client_config, load_dev_config, load_server_config
from server.sdk import DroverClient, DroverError, parse_addresses

DEFAULT_ADDRESS: Final = "127.0.0.1:4646"
ADDRESS_ENV: Final = "DROVER_ADDR"
DEFAULT_MONITOR_TIMEOUT_S: Final = 10.0
# How often to re-read an eval if the server answers a blocking query without blocking.
_MONITOR_POLL_S: Final = 0.2
_UUID_LEN: Final = 36
_SHORT_ID: Final = 8

Handler = Callable[[argparse.Namespace], int]
T = TypeVar("T")


class CLIError(Exception):
    """An expected failure: printed as ``Error: <message>``, exit status 1."""


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (CLIError, DroverError, ConfigError) as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        # stdout was closed early (``drover ... | head``): stop quietly, like other CLI tools.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        return 130


def _fail(message: str) -> int:
    print(f"Error: {' '.join(message.split()) or 'unknown error'}", file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------------------
# The parser


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """Add ``-name`` and ``--name``; the dest is the snake_case name."""
    parser.add_argument(f"-{name}", f"--{name}", dest=name.replace("-", "_"), **kwargs)


def _conn_flags(p: argparse.ArgumentParser) -> None:
    _flag(
        p,
        "address",
        metavar="ADDR",
        help=f"server gRPC address(es), comma-separated (env {ADDRESS_ENV}, default {DEFAULT_ADDRESS})",
    )
    _flag(
        p,
        "retry-deadline",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="keep retrying while no server or leader is available for this long",
    )


def _read_flags(p: argparse.ArgumentParser) -> None:
    _conn_flags(p)
    _flag(p, "stale", action="store_true", help="let any server answer from its own state")
    _flag(p, "json", action="store_true", help="print JSON (proto field names)")
    _flag(p, "verbose", action="store_true", help="print full IDs")


def _write_flags(p: argparse.ArgumentParser, *, monitor: bool = False) -> None:
    _conn_flags(p)
    _flag(p, "json", action="store_true", help="print the response as JSON (implies -detach)")
    _flag(p, "verbose", action="store_true", help="print full IDs")
    if monitor:
        _flag(p, "detach", action="store_true", help="return after registering, do not monitor")
        _flag(p, "monitor-timeout", type=float, default=DEFAULT_MONITOR_TIMEOUT_S, metavar="SECONDS")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drover", description="drover cluster scheduler", allow_abbrev=False
    )
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(group: Any, name: str, handler: Handler, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(name, help=help_, allow_abbrev=False)
        p.set_defaults(handler=handler)
        return p

    def group(name: str, help_: str, parent: Any = top) -> Any:
        p = parent.add_parser(name, help=help_, allow_abbrev=False)
        return p.add_subparsers(dest=f"{name}_command", required=True, metavar="SUBCOMMAND")

    # agent
    p = command(top, "agent", _cmd_agent, "run a server, client or dev agent")
    mode = p.add_mutually_exclusive_group(required=True)
    for name in ("dev", "server", "client"):
        mode.add_argument(f"-{name}", f"--{name}", dest="mode", action="store_const", const=name)
    _flag(p, "config", metavar="FILE", help="HCL (.hcl) or YAML (.yaml/.yml/.json) config file")
    _flag(p, "node-name")
    _flag(p, "data-dir")
    _flag(p, "bind")
    _flag(p, "grpc-port", type=int)
    _flag(p, "raft-port", type=int)
    _flag(p, "peers", help="other servers' raft addresses, comma-separated")
    _flag(p, "raft-key-file")
    _flag(p, "servers", help="servers' gRPC addresses, comma-separated")
    _flag(p, "datacenter")
    _flag(p, "node-class")
    _flag(p, "meta", action="append", metavar="KEY=VALUE", help="client node metadata (repeatable)")
    _flag(p, "num-workers", type=int)
    _flag(p, "log-json", action="store_true", default=None)
    _flag(p, "log-level", choices=("debug", "info", "warning", "error"))

    # job
    jobs = group("job", "register, inspect and stop jobs")
    p = command(jobs, "run", _cmd_job_run, "register a job from a job file and monitor its evaluation")
    p.add_argument("file")
    _write_flags(p, monitor=True)
    p = command(jobs, "status", _cmd_job_status, "list jobs, or show one job")
    p.add_argument("job", nargs="?")
    _read_flags(p)
    _flag(p, "namespace", default="")
    p = command(jobs, "stop", _cmd_job_stop, "stop (deregister) a job")
    p.add_argument("job")
    _write_flags(p, monitor=True)
    _flag(p, "purge", action="store_true", help="also remove the job from the state")
    _flag(p, "namespace", default="")
    p = command(jobs, "allocs", _cmd_job_allocs, "list a job's allocations")
    p.add_argument("job")
    _read_flags(p)
    _flag(p, "namespace", default="")

    # node
    nodes = group("node", "inspect and drain client nodes")
    p = command(nodes, "status", _cmd_node_status, "list nodes, or show one node")
    p.add_argument("node", nargs="?")
    _read_flags(p)
    p = command(nodes, "drain", _cmd_node_drain, "start or stop draining a node")
    p.add_argument("node")
    _write_flags(p)
    toggle = p.add_mutually_exclusive_group(required=True)
    toggle.add_argument("-enable", "--enable", dest="enable", action="store_const", const=True)
    toggle.add_argument("-disable", "--disable", dest="enable", action="store_const", const=False)
    _flag(p, "deadline", default="1h", help="drain deadline, e.g. 30m, 1h (default 1h)")
    _flag(p, "no-deadline", action="store_true", help="no deadline: wait for allocs to migrate")
    _flag(p, "force", action="store_true", help="stop all allocs at once")
    _flag(p, "ignore-system", action="store_true", help="leave system job allocs running")
    _flag(p, "keep-ineligible", action="store_true", help="with -disable: keep the node ineligible")
    p = command(nodes, "eligibility", _cmd_node_eligibility, "toggle a node's scheduling eligibility")
    p.add_argument("node")
    _write_flags(p)
    toggle = p.add_mutually_exclusive_group(required=True)
    toggle.add_argument("-enable", "--enable", dest="enable", action="store_const", const=True)
    toggle.add_argument("-disable", "--disable", dest="enable", action="store_const", const=False)

    # eval
    evals = group("eval", "inspect evaluations")
    p = command(evals, "list", _cmd_eval_list, "list evaluations")
    _read_flags(p)
    _flag(p, "job", default="", help="only this job's evaluations")
    _flag(p, "status", default="", help="only evaluations with this status")
    p = command(evals, "status", _cmd_eval_status, "show one evaluation")
    p.add_argument("eval")
    _read_flags(p)

    # alloc
    allocs = group("alloc", "inspect allocations")
    p = command(allocs, "status", _cmd_alloc_status, "show one allocation")
    p.add_argument("alloc")
    _read_flags(p)

    # operator
    operator = group("operator", "cluster operations")
    raft = group("raft", "raft cluster membership", operator)
    p = command(raft, "list-peers", _cmd_raft_peers, "list the raft peers")
    _read_flags(p)
    snapshot = group("snapshot", "save and restore the state", operator)
    p = command(snapshot, "save", _cmd_snapshot_save, "write the cluster state to FILE")
    p.add_argument("file")
    _conn_flags(p)
    _flag(p, "stale", action="store_true")
    p = command(snapshot, "restore", _cmd_snapshot_restore, "replace the cluster state with FILE")
    p.add_argument("file")
    _conn_flags(p)
    p = command(operator, "state", _cmd_operator_state, "state digest of each addressed server")
    _conn_flags(p)
    _flag(p, "json", action="store_true")
    return parser


# ---------------------------------------------------------------------------------------
# agent

_AGENT_KEYS: Final = {
    "dev": ("grpc_port", "data_dir", "log_json", "log_level"),
    "server": (
        "node_name",
        "data_dir",
        "bind",
        "grpc_port",
        "raft_port",
        "peers",
        "raft_key_file",
        "num_workers",
        "log_json",
        "log_level",
    ),
    "client": (
        "node_name",
        "data_dir",
        "servers",
        "datacenter",
        "node_class",
        "meta",
        "log_json",
        "log_level",
    ),
}
_ALL_AGENT_KEYS: Final = frozenset(k for keys in _AGENT_KEYS.values() for k in keys)


def _cmd_agent(args: argparse.Namespace) -> int:
    mode: str = args.mode
    flags: dict[str, object] = {}
    for key in sorted(_ALL_AGENT_KEYS):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in _AGENT_KEYS[mode]:
            raise CLIError(f"flag -{key.replace('_', '-')} does not apply to agent -{mode}")
        flags[key] = _parse_meta(value) if key == "meta" else value
    # Imported here: the agents pull in raft and the drivers, which other commands never need.
    rc: int
    if mode == "dev":
        from server.agent import run_dev  # type: ignore[import-not-found, unused-ignore]

        rc = run_dev(load_dev_config(flags, args.config))
    elif mode == "server":
        from server.agent import run_server  # type: ignore[import-not-found, unused-ignore]

        rc = run_server(load_server_config(flags, args.config))
    else:
        from client_agent.agent import run_client  # type: ignore[import-not-found, unused-ignore]

        rc = run_client(load_client_config(flags, args.config))
    return rc


def _parse_meta(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CLIError(f"flag -meta: expected KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------
# job


def _cmd_job_run(args: argparse.Namespace) -> int:
    job_pb = _load_job_file(args.file)
    with _client(args) as client:
        resp = client.register_job(job_pb)
        if args.json:
            _print_json(resp)
            return 0
        print(f'Job "{job_pb.id}" registered (version {resp.version}), evaluation {resp.eval_id}')
        if resp.warnings:
            print(f"Warnings: {resp.warnings}")
        if args.detach or not resp.eval_id:
            return 0
        _monitor_eval(client, args, resp.eval_id)
        _print_allocs_table(client.list_allocs(job_id=job_pb.id, namespace=job_pb.namespace).allocs, args)
    return 0


def _load_job_file(path: str) -> structs_pb2.Job:
    """Parse and locally validate a job file, so mistakes get a message before any RPC."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        from server.jobspec import (  # type: ignore[import-not-found, unused-ignore]
            JobspecError,
            parse_jobspec,
        )
    except ModuleNotFoundError as exc:
        if exc.name != "server.jobspec":
            raise
        raise CLIError("cannot read job files: server.jobspec is not available") from exc
    try:
        job: Job = parse_jobspec(text, filename=path)
    except JobspecError as exc:
        raise CLIError(str(exc)) from exc
    from scheduler.validate import ValidationError, canonicalize_job, validate_job

    try:
        # The server canonicalizes too; the job is sent as parsed.
        validate_job(canonicalize_job(job))
    except ValidationError as exc:
        raise CLIError(str(exc)) from exc
    return to_proto(job, structs_pb2.Job())


def _monitor_eval(client: DroverClient, args: argparse.Namespace, eval_id: str) -> None:
    """Follow an eval with blocking queries until it leaves "pending" or the timeout passes."""
    timeout_s: float = args.monitor_timeout
    deadline = time.monotonic() + timeout_s
    print(f'==> Monitoring evaluation "{_id(eval_id, args)}"')
    resp = client.get_eval(eval_id, stale=args.stale if "stale" in args else False)
    ev = resp.eval
    if ev.job_id:
        print(f'    Evaluation triggered by job "{ev.job_id}"')
    elif ev.node_id:
        print(f'    Evaluation triggered by node "{_id(ev.node_id, args)}"')
    print(f'    Evaluation status "{ev.status}"')
    index = resp.meta.index
    while ev.status == "pending":
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            print(f'==> Evaluation "{_id(eval_id, args)}" still "pending" after {timeout_s:g}s')
            return
        resp = client.get_eval(eval_id, min_index=index, wait_ns=max(int(remaining * 1e9), 1))
        if resp.eval.status != ev.status:
            print(f'    Evaluation status changed: "{ev.status}" -> "{resp.eval.status}"')
        ev = resp.eval
        if resp.meta.index <= index:
            # The server answered without blocking; do not spin on it.
            time.sleep(min(_MONITOR_POLL_S, max(deadline - time.monotonic(), 0)))
        index = max(index, resp.meta.index)
    for group, count in sorted(ev.queued_allocations.items()):
        if count:
            print(f'    Task Group "{group}": {count} allocation(s) queued')
    for group, reason in sorted(ev.failed_tg_allocs.items()):
        print(f'    Task Group "{group}" failed to place: {reason}')
    if ev.blocked_eval:
        print(f'    Evaluation "{_id(ev.blocked_eval, args)}" waiting for additional capacity')
    if ev.status_description:
        print(f"    {ev.status_description}")
    print(f'==> Evaluation "{_id(eval_id, args)}" finished with status "{ev.status}"')


def _cmd_job_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if not args.job:
            listing = client.list_jobs(namespace=args.namespace, stale=args.stale)
            if args.json:
                _print_json(listing.jobs)
                return 0
            rows = [
                [j.id, j.type, str(j.priority), j.status, _time(j.submit_time_ns)]
                for j in sorted(listing.jobs, key=lambda j: j.id)
            ]
            _print_table(["ID", "Type", "Priority", "Status", "Submit Date"], rows, empty="No jobs")
            return 0
        got = _get_job(client, args)
        job = got.job
        allocs = client.list_allocs(job_id=job.id, namespace=job.namespace, stale=args.stale).allocs
        if args.json:
            _print_json({"job": got.job, "summary": got.summary, "allocations": allocs})
            return 0
        _print_kv(
            [
                ("ID", job.id),
                ("Name", job.name),
                ("Namespace", job.namespace),
                ("Type", job.type),
                ("Priority", str(job.priority)),
                ("Datacenters", ",".join(job.datacenters)),
                ("Status", job.status),
                ("Version", str(job.version)),
                ("Stop", str(job.stop).lower()),
                ("Submit Date", _time(job.submit_time_ns)),
            ]
        )
        print("\nSummary")
        states = ("queued", "starting", "running", "failed", "complete", "lost", "unknown")
        summary_rows = [
            [name, *(str(getattr(tg, state)) for state in states)]
            for name, tg in sorted(got.summary.summary.items())
        ]
        _print_table(["Task Group", *(s.capitalize() for s in states)], summary_rows, empty="No summary")
        print("\nAllocations")
        _print_allocs_table(allocs, args)
    return 0


def _cmd_job_stop(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _get_job(client, args).job
        resp = client.deregister_job(job.id, namespace=job.namespace, purge=args.purge)
        if args.json:
            _print_json(resp)
            return 0
        verb = "purged" if args.purge else "stopped"
        print(f'Job "{job.id}" {verb}, evaluation {resp.eval_id or "(none)"}')
        if not args.detach and resp.eval_id:
            _monitor_eval(client, args, resp.eval_id)
    return 0


def _cmd_job_allocs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _get_job(client, args).job
        allocs = client.list_allocs(job_id=job.id, namespace=job.namespace, stale=args.stale).allocs
        if args.json:
            _print_json(allocs)
            return 0
        _print_allocs_table(allocs, args)
    return 0


def _get_job(client: DroverClient, args: argparse.Namespace) -> api_pb2.JobGetResponse:
    """The job named exactly, or else the only job whose ID starts with the argument."""
    stale: bool = getattr(args, "stale", False)
    try:
        return client.get_job(args.job, namespace=args.namespace, stale=stale)
    except DroverError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND:
            raise
        listing = client.list_jobs(prefix=args.job, namespace=args.namespace, stale=stale)
        matches = [j.id for j in listing.jobs if j.id.startswith(args.job)]
        if len(matches) != 1:
            _no_unique_match("job", args.job, matches, exc)
        return client.get_job(matches[0], namespace=args.namespace, stale=stale)


# ---------------------------------------------------------------------------------------
# node


def _cmd_node_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if not args.node:
            nodes = client.list_nodes(stale=args.stale).nodes
            if args.json:
                _print_json(nodes)
                return 0
            rows = [
                [
                    _id(n.id, args),
                    n.datacenter,
                    n.name,
                    n.node_class or "<none>",
                    str(n.HasField("drain_strategy")).lower(),
                    n.scheduling_eligibility,
                    n.status,
                ]
                for n in sorted(nodes, key=lambda n: (n.name, n.id))
            ]
            _print_table(
                ["ID", "DC", "Name", "Class", "Drain", "Eligibility", "Status"], rows, empty="No nodes"
            )
            return 0
        node = client.get_node(_resolve_node(client, args.node, args.stale), stale=args.stale).node
        allocs = client.list_allocs(node_id=node.id, stale=args.stale).allocs
        if args.json:
            _print_json({"node": node, "allocations": allocs})
            return 0
        drain = "false"
        if node.HasField("drain_strategy"):
            ds = node.drain_strategy
            drain = f"true; deadline {_duration(ds.deadline_ns)}"
            if ds.force_deadline_at_ns:
                drain += f" (at {_time(ds.force_deadline_at_ns)})"
        res = node.resources
        _print_kv(
            [
                ("ID", node.id),
                ("Name", node.name),
                ("Class", node.node_class or "<none>"),
                ("DC", node.datacenter),
                ("Address", node.address),
                ("Drain", drain),
                ("Eligibility", node.scheduling_eligibility),
                ("Status", node.status),
                ("Status Updated", _time(node.status_updated_at_ns)),
                ("Resources", f"cpu {res.cpu_mhz} MHz, memory {res.memory_mb} MiB, disk {res.disk_mb} MiB"),
            ]
        )
        if node.events:
            print("\nNode Events")
            rows = [[_time(e.timestamp_ns), e.subsystem, e.message] for e in node.events]
            _print_table(["Time", "Subsystem", "Message"], rows)
        print("\nAllocations")
        _print_allocs_table(allocs, args)
    return 0


def _cmd_node_drain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        node_id = _resolve_node(client, args.node, False)
        if args.enable:
            if args.force:
                deadline_ns = -1
            elif args.no_deadline:
                deadline_ns = 0
            else:
                deadline_ns = parse_duration_ns(args.deadline)
            strategy = structs_pb2.DrainStrategy(
                deadline_ns=deadline_ns, ignore_system_jobs=args.ignore_system
            )
            resp = client.update_drain(node_id, strategy)
        else:
            resp = client.update_drain(node_id, None, mark_eligible=not args.keep_ineligible)
        if args.json:
            _print_json(resp)
            return 0
        print(f'Node "{_id(node_id, args)}" drain strategy {"set" if args.enable else "unset"}')
    return 0


def _cmd_node_eligibility(args: argparse.Namespace) -> int:
    eligibility = "eligible" if args.enable else "ineligible"
    with _client(args) as client:
        node_id = _resolve_node(client, args.node, False)
        resp = client.update_eligibility(node_id, eligibility)
        if args.json:
            _print_json(resp)
            return 0
        print(f'Node "{_id(node_id, args)}" scheduling eligibility set: {eligibility} for scheduling')
    return 0


def _resolve_node(client: DroverClient, ref: str, stale: bool) -> str:
    """A node ID from a full ID, a unique ID prefix or an exact node name."""
    if len(ref) == _UUID_LEN:
        return ref
    nodes = client.list_nodes(stale=stale).nodes
    matches = [n.id for n in nodes if n.id.startswith(ref)] or [n.id for n in nodes if n.name == ref]
    if len(matches) != 1:
        _no_unique_match("node", ref, matches, None)
    return matches[0]


# ---------------------------------------------------------------------------------------
# eval and alloc


def _cmd_eval_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        evals = client.list_evals(job_id=args.job, status=args.status, stale=args.stale).evals
        if args.json:
            _print_json(evals)
            return 0
        rows = [
            [
                _id(e.id, args),
                str(e.priority),
                e.triggered_by,
                e.job_id,
                _id(e.node_id, args),
                e.status,
                str(bool(e.failed_tg_allocs)).lower(),
            ]
            for e in sorted(evals, key=lambda e: e.create_index, reverse=True)
        ]
        headers = ["ID", "Priority", "Triggered By", "Job ID", "Node ID", "Status", "Placement Failures"]
        _print_table(headers, rows, empty="No evaluations")
    return 0


def _cmd_eval_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        ev = _get_by_prefix(
            "evaluation",
            args.eval,
            lambda i: client.get_eval(i, stale=args.stale).eval,
            lambda: [e.id for e in client.list_evals(stale=args.stale).evals],
        )
        if args.json:
            _print_json(ev)
            return 0
        _print_kv(
            [
                ("ID", ev.id),
                ("Status", ev.status),
                ("Status Description", ev.status_description or "<none>"),
                ("Type", ev.type),
                ("Triggered By", ev.triggered_by),
                ("Job ID", ev.job_id),
                ("Node ID", ev.node_id or "<none>"),
                ("Priority", str(ev.priority)),
                ("Previous Eval", ev.previous_eval or "<none>"),
                ("Next Eval", ev.next_eval or "<none>"),
                ("Blocked Eval", ev.blocked_eval or "<none>"),
                ("Create Time", _time(ev.create_time_ns)),
                ("Modify Time", _time(ev.modify_time_ns)),
            ]
        )
        if ev.queued_allocations:
            print("\nQueued Allocations")
            rows = [[g, str(n)] for g, n in sorted(ev.queued_allocations.items())]
            _print_table(["Task Group", "Queued"], rows)
        if ev.failed_tg_allocs:
            print("\nFailed Placements")
            rows = [[g, reason] for g, reason in sorted(ev.failed_tg_allocs.items())]
            _print_table(["Task Group", "Reason"], rows)
    return 0


def _cmd_alloc_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        alloc = _get_by_prefix(
            "allocation",
            args.alloc,
            lambda i: client.get_alloc(i, stale=args.stale).alloc,
            lambda: [a.id for a in client.list_allocs(stale=args.stale).allocs],
        )
        if args.json:
            _print_json(alloc)
            return 0
        _print_kv(
            [
                ("ID", alloc.id),
                ("Eval ID", _id(alloc.eval_id, args)),
                ("Name", alloc.name),
                ("Node ID", _id(alloc.node_id, args)),
                ("Node Name", alloc.node_name),
                ("Job ID", alloc.job_id),
                ("Job Version", str(alloc.job_version)),
                ("Task Group", alloc.task_group),
                ("Client Status", alloc.client_status),
                ("Client Description", alloc.client_description or "<none>"),
                ("Desired Status", alloc.desired_status),
                ("Desired Description", alloc.desired_description or "<none>"),
                ("Created", _time(alloc.create_time_ns)),
                ("Modified", _time(alloc.modify_time_ns)),
                ("Previous Allocation", alloc.previous_allocation or "<none>"),
                ("Next Allocation", alloc.next_allocation or "<none>"),
            ]
        )
        for name, state in sorted(alloc.task_states.items()):
            print(f'\nTask "{name}" is "{state.state}"' + (" (failed)" if state.failed else ""))
            print(
                f"Restarts: {state.restarts}  Started: {_time(state.started_at_ns) or '-'}"
                f"  Finished: {_time(state.finished_at_ns) or '-'}"
            )
            rows = [[_time(e.time_ns), e.type, e.message] for e in state.events]
            _print_table(["Time", "Type", "Description"], rows, empty="No events")
        if alloc.state_history:
            print("\nClient Status History")
            rows = [[_time(c.time_ns), c.field, c.value] for c in alloc.state_history]
            _print_table(["Time", "Field", "Value"], rows)
    return 0


def _get_by_prefix(kind: str, ref: str, get: Callable[[str], T], list_ids: Callable[[], list[str]]) -> T:
    """Get by exact ID, else by the only ID that starts with ``ref``."""
    try:
        return get(ref)
    except DroverError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND or len(ref) >= _UUID_LEN:
            raise
        matches = [i for i in list_ids() if i.startswith(ref)]
        if len(matches) != 1:
            _no_unique_match(kind, ref, matches, exc)
        return get(matches[0])


def _no_unique_match(kind: str, ref: str, matches: list[str], exc: DroverError | None) -> None:
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5]) + (", ..." if len(matches) > 5 else "")
        raise CLIError(f'prefix "{ref}" matched {len(matches)} {kind}s: {shown}')
    if exc is not None:
        raise exc
    raise CLIError(f'no {kind} matches "{ref}"')


# ---------------------------------------------------------------------------------------
# operator


def _cmd_raft_peers(args: argparse.Namespace) -> int:
    with _client(args) as client:
        resp = client.raft_peers(stale=args.stale)
        if args.json:
            _print_json(resp)
            return 0
        rows = [
            [
                p.name,
                p.raft_address,
                p.grpc_address,
                "leader" if p.leader else "follower",
                str(p.voter).lower(),
                str(p.connected).lower(),
            ]
            for p in resp.peers
        ]
        _print_table(["Node", "Raft Address", "gRPC Address", "State", "Voter", "Connected"], rows)
    return 0


def _cmd_snapshot_save(args: argparse.Namespace) -> int:
    path: str = args.file
    with _client(args) as client:
        resp = client.snapshot_save(stale=args.stale)
    data = resp.snapshot.SerializeToString()
    _write_file_atomically(path, data)
    print(f"State file written to {path} (index {resp.snapshot.index}, {len(data)} bytes)")
    return 0


def _write_file_atomically(path: str, data: bytes) -> None:
    """Write beside the target and rename, so a failed save never leaves a truncated file.

    Only for regular files: renaming over a device or a FIFO (``/dev/stdout``) would replace
    the device node itself, so those are written in place.
    """
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "wb") as fh:
            fh.write(data)
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _cmd_snapshot_restore(args: argparse.Namespace) -> int:
    with open(args.file, "rb") as fh:
        data = fh.read()
    snapshot = raft_pb2.StateSnapshot()
    try:
        snapshot.ParseFromString(data)
    except DecodeError as exc:
        raise CLIError(f"{args.file}: not a drover snapshot ({exc})") from exc
    with _client(args) as client:
        resp = client.snapshot_restore(snapshot)
    print(
        f"Snapshot restored from {args.file} (snapshot index {snapshot.index}, raft index {resp.meta.index})"
    )
    return 0


def _cmd_operator_state(args: argparse.Namespace) -> int:
    """Ask each addressed server for its own digest (StateDigest is never forwarded)."""
    addresses = parse_addresses(_address(args))
    if len(addresses) == 1:
        with _client(args) as client:
            resp = client.state_digest()
        if args.json:
            _print_json(resp)
        else:
            _print_kv(
                [
                    ("Server", resp.server),
                    ("Leader", str(resp.leader).lower()),
                    ("Term", str(resp.term)),
                    ("Applied Index", str(resp.applied_index)),
                    ("Commit Index", str(resp.commit_index)),
                    ("Digest", resp.digest),
                ]
            )
        return 0
    answers: list[tuple[str, api_pb2.StateDigestResponse | DroverError]] = []
    for addr in addresses:
        with DroverClient(addr, retry_deadline=args.retry_deadline) as client:
            try:
                answers.append((addr, client.state_digest()))
            except DroverError as exc:
                answers.append((addr, exc))
    failed = sum(isinstance(a, DroverError) for _, a in answers)
    if args.json:
        _print_json(
            [a if isinstance(a, Message) else {"address": addr, "error": str(a)} for addr, a in answers]
        )
    else:
        rows = [
            [
                addr,
                a.server,
                str(a.leader).lower(),
                str(a.term),
                str(a.applied_index),
                str(a.commit_index),
                a.digest,
            ]
            if isinstance(a, api_pb2.StateDigestResponse)
            else [addr, "-", "-", "-", "-", "-", f"ERROR: {a}"]
            for addr, a in answers
        ]
        _print_table(["Address", "Server", "Leader", "Term", "Applied", "Commit", "Digest"], rows)
    if failed:
        return _fail(f"{failed} of {len(addresses)} servers did not answer")
    return 0


# ---------------------------------------------------------------------------------------
# Shared helpers


def _address(args: argparse.Namespace) -> str:
    flag: str | None = args.address
    return flag or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


def _client(args: argparse.Namespace) -> DroverClient:
    try:
        return DroverClient(_address(args), retry_deadline=args.retry_deadline)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc


def _id(value: str, args: argparse.Namespace) -> str:
    verbose: bool = getattr(args, "verbose", False)
    return value if verbose else value[:_SHORT_ID]


def _print_allocs_table(allocs: Iterable[structs_pb2.Allocation], args: argparse.Namespace) -> None:
    rows = [
        [
            _id(a.id, args),
            _id(a.node_id, args),
            a.task_group,
            str(a.job_version),
            a.desired_status,
            a.client_status,
            _time(a.create_time_ns),
            _time(a.modify_time_ns),
        ]
        for a in sorted(allocs, key=lambda a: (a.create_index, a.name))
    ]
    headers = ["ID", "Node ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified"]
    _print_table(headers, rows, empty="No allocations placed")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, no trailing spaces."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines)


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, empty: str = "") -> None:
    if not rows and empty:
        print(empty)
        return
    print(format_table(headers, rows))


def _print_kv(pairs: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        print(f"{key.ljust(width)} = {value}".rstrip())


def _jsonable(value: object) -> object:
    if isinstance(value, Message):
        return MessageToDict(value, preserving_proto_field_name=True)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_jsonable(v) for v in value]
    return value


def _print_json(value: object) -> None:
    print(json.dumps(_jsonable(value), indent=2))


def _time(ns: int) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_DURATION_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration_ns(text: str) -> int:
    """A Go-style duration ("1h30m", "90s", "-1s") in nanoseconds."""
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    if body == "0":
        return 0
    pos, total = 0, 0.0
    while pos < len(body):
        m = _DURATION_PART.match(body, pos)
        if m is None:
            raise CLIError(f'invalid duration "{text}" (examples: 30s, 10m, 1h30m)')
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if not body:
        raise CLIError(f'invalid duration "{text}" (examples: 30s, 10m, 1h30m)')
    return sign * round(total)


def _duration(ns: int) -> str:
    if ns < 0:
        return "force"
    if ns == 0:
        return "none"
    seconds = ns // 1_000_000_000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v) or f"{ns}ns"


if __name__ == "__main__":
    sys.exit(main())
