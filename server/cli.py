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
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from drover.v1 import api_pb2, raft_pb2, structs_pb2
from scheduler.structs import Job
from server._cli_format import (
    ALLOC_HEADERS,
    CLIError,
    alloc_rows,
    fmt_duration,
    fmt_time,
    format_table,
    parse_duration_ns,
    plan_header,
    plan_table,
    print_json,
    print_kv,
    print_table,
    short_id,
)
from server.codec import to_proto
from server.config import ConfigError, load_client_config, load_dev_config, load_server_config
from server.sdk import DroverClient, DroverError, parse_addresses

__all__ = ["CLIError", "format_table", "main", "parse_duration_ns"]

DEFAULT_ADDRESS: Final = "127.0.0.1:4646"
ADDRESS_ENV: Final = "DROVER_ADDR"
DEFAULT_MONITOR_TIMEOUT_S: Final = 60.0
# While an eval is pending, one blocking query on the job's allocs waits at most this long
# before the eval is read again.
_MONITOR_WAIT_S: Final = 1.0
# How long to pause when the server answers a blocking query without blocking.
_MONITOR_POLL_S: Final = 0.2
_UUID_LEN: Final = 36
# The server rejects negative drain deadlines, so "-force" is the smallest positive one:
# the force deadline has passed as soon as the drain starts.
_FORCE_DRAIN_DEADLINE_NS: Final = 1
_NODE_EVENTS_SHOWN: Final = 10

Handler = Callable[[argparse.Namespace], int]
T = TypeVar("T")


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
        _flag(
            p,
            "monitor-timeout",
            type=float,
            default=DEFAULT_MONITOR_TIMEOUT_S,
            metavar="SECONDS",
            help=f"stop monitoring the evaluation after this long (default {DEFAULT_MONITOR_TIMEOUT_S:g})",
        )


_JOB_RUN_EPILOG: Final = """\
Unless -detach (or -json) is given, the registration's evaluation is monitored: each
allocation it creates is printed as it appears, until the evaluation completes, fails or
blocks, or -monitor-timeout passes.

Periodic and parameterized jobs get no evaluation at registration: there is nothing to
monitor.

Exit status:
  0  registered; the evaluation completed, blocked (allocations queued until capacity
     frees up; the blocked evaluation's ID is printed), or is still pending after
     -monitor-timeout
  1  an error, or the evaluation failed
  2  usage error
"""

_PLAN_EPILOG: Final = """\
The server runs the scheduler against a private copy of the cluster state and reports,
per task group, how many allocations it would place, update (destructively or in
place), stop, migrate, mark lost or leave alone, and how many could not be placed now
(they would be queued). Nothing is registered or changed.

Exit status:
  0  the plan was computed, whether or not the job would change anything
     (unlike Nomad, which exits 1 when allocations would be created or destroyed)
  1  an error (bad job file, invalid job, server error)
  2  usage error
"""


_DISPATCH_EPILOG: Final = """\
The parameterized job's payload setting decides whether a payload file is required,
optional or forbidden; -meta keys must be among its meta_required and meta_optional keys,
and every meta_required key must be given. The child job is named
<job>/dispatch-<unix time>-<8 hex> and gets an evaluation, monitored unless -detach.
"""

_RAFT_OFFLINE_EPILOG: Final = """\
Reads the raft journal and snapshot in DIR/raft of a STOPPED server, without contacting any
server. While a server runs on DIR this refuses (the data dir is locked). Replaying uses the
server's own FSM, so the state printed is the state the server had at that index.
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drover", description="drover cluster scheduler", allow_abbrev=False
    )
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        group: Any, name: str, handler: Handler, help_: str, epilog: str | None = None
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(
            name,
            help=help_,
            description=help_[:1].upper() + help_[1:] + "." if epilog else None,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
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
    _flag(p, "min-heartbeat-ttl", metavar="DURATION", help="shortest client heartbeat TTL (10s)")
    _flag(p, "max-heartbeats-per-second", type=int, help="heartbeat rate the TTL scales to (50)")
    _flag(p, "heartbeat-grace", metavar="DURATION", help="extra wait before a node is marked down (10s)")
    _flag(p, "failover-heartbeat-ttl", metavar="DURATION", help="TTL every node gets from a new leader (5m)")
    _flag(p, "log-json", action="store_true", default=None)
    _flag(p, "log-level", choices=("debug", "info", "warning", "error"))

    # job
    jobs = group("job", "register, inspect and stop jobs")
    p = command(
        jobs,
        "run",
        _cmd_job_run,
        "register a job from a job file and monitor its evaluation",
        _JOB_RUN_EPILOG,
    )
    p.add_argument("file")
    _write_flags(p, monitor=True)
    p = command(
        jobs, "plan", _cmd_job_plan, "dry run: show what registering a job file would do", _PLAN_EPILOG
    )
    p.add_argument("file")
    _conn_flags(p)
    _flag(p, "json", action="store_true", help="print the plan response as JSON")
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
    p = command(
        jobs,
        "dispatch",
        _cmd_job_dispatch,
        "run a parameterized job: create a child job with metadata and a payload",
        _DISPATCH_EPILOG,
    )
    p.add_argument("job")
    p.add_argument("payload", nargs="?", help="file whose contents are the payload ('-' reads stdin)")
    _write_flags(p, monitor=True)
    _flag(p, "meta", action="append", metavar="KEY=VALUE", help="dispatch metadata (repeatable)")
    _flag(
        p,
        "idempotency-token",
        default="",
        help="if a child was already dispatched with this token, return it instead of dispatching again",
    )
    _flag(p, "namespace", default="")
    periodic = group("periodic", "periodic job operations", jobs)
    p = command(periodic, "force", _cmd_job_periodic_force, "launch a periodic job's child now")
    p.add_argument("job")
    _write_flags(p, monitor=True)
    _flag(p, "namespace", default="")

    # node
    nodes = group("node", "inspect and drain client nodes")
    p = command(nodes, "status", _cmd_node_status, "list nodes, or show one node")
    p.add_argument("node", nargs="?")
    _read_flags(p)
    p = command(nodes, "drain", _cmd_node_drain, "start or stop draining a node")
    p.add_argument("node", help="node ID, unique ID prefix, or node name")
    _write_flags(p)
    toggle = p.add_mutually_exclusive_group(required=True)
    toggle.add_argument("-enable", "--enable", dest="enable", action="store_const", const=True)
    toggle.add_argument("-disable", "--disable", dest="enable", action="store_const", const=False)
    _flag(p, "deadline", metavar="DURATION", help="drain deadline, e.g. 30m, 1h (default 1h)")
    _flag(p, "no-deadline", action="store_true", help="no deadline: wait for allocs to migrate")
    _flag(p, "force", action="store_true", help="stop all allocs at once")
    _flag(p, "ignore-system", action="store_true", help="leave system job allocs running")
    _flag(p, "keep-ineligible", action="store_true", help="with -disable: keep the node ineligible")
    p = command(nodes, "eligibility", _cmd_node_eligibility, "toggle a node's scheduling eligibility")
    p.add_argument("node", help="node ID, unique ID prefix, or node name")
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
    p = command(evals, "status", _cmd_eval_status, "show one evaluation and the allocations it created")
    p.add_argument("eval")
    _read_flags(p)

    # alloc
    allocs = group("alloc", "inspect allocations")
    p = command(allocs, "status", _cmd_alloc_status, "show one allocation")
    p.add_argument("alloc")
    _read_flags(p)

    # system
    system = group("system", "cluster-wide maintenance")
    reconcile = group("reconcile", "recompute derived state", system)
    p = command(
        reconcile, "summaries", _cmd_reconcile_summaries, "recompute every job summary and report corrections"
    )
    _conn_flags(p)
    _flag(p, "json", action="store_true")

    # operator
    operator = group("operator", "cluster operations")
    raft = group("raft", "raft peers, and offline tools for a stopped server's raft data", operator)
    p = command(raft, "list-peers", _cmd_raft_peers, "list the raft peers")
    _read_flags(p)
    p = command(
        raft,
        "logs",
        _cmd_raft_logs,
        "print a stopped server's raft log: one JSON object per entry",
        _RAFT_OFFLINE_EPILOG,
    )
    _flag(p, "data-dir", required=True, metavar="DIR", help="the server's data dir")
    _flag(p, "pretty", action="store_true", help="indent each object (several lines per entry)")
    p = command(
        raft,
        "state",
        _cmd_raft_state,
        "print a stopped server's state at a raft index, every table as JSON",
        _RAFT_OFFLINE_EPILOG,
    )
    _flag(p, "data-dir", required=True, metavar="DIR", help="the server's data dir")
    _flag(
        p,
        "last-index",
        type=int,
        default=None,
        metavar="N",
        help="replay up to raft index N (default: the whole log; negative: N entries before the end)",
    )
    snapshot = group("snapshot", "save and restore the state", operator)
    p = command(snapshot, "save", _cmd_snapshot_save, "write the cluster state to FILE")
    p.add_argument("file")
    _conn_flags(p)
    _flag(p, "stale", action="store_true")
    p = command(snapshot, "restore", _cmd_snapshot_restore, "replace the cluster state with FILE")
    p.add_argument("file")
    _conn_flags(p)
    p = command(
        snapshot, "inspect", _cmd_snapshot_inspect, "show the index, size and tables of a snapshot FILE"
    )
    p.add_argument("file", help="a `snapshot save` file, or a data dir's raft/snapshot.pb")
    _flag(p, "json", action="store_true")
    p = command(operator, "state", _cmd_operator_state, "state digest of each addressed server")
    _conn_flags(p)
    _flag(p, "json", action="store_true")
    p = command(
        operator, "invariants", _cmd_operator_invariants, "check invariants 1 and 2 on each addressed server"
    )
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
        "min_heartbeat_ttl",
        "max_heartbeats_per_second",
        "heartbeat_grace",
        "failover_heartbeat_ttl",
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
            print_json(resp)
            return 0
        if not resp.eval_id:
            print(f'Job "{job_pb.id}" registered (version {resp.version})')
            _print_register_warnings(resp.warnings)
            kind = _template_kind(job_pb)
            if kind == "periodic":
                print("Job is periodic: each run it launches is evaluated then; nothing to monitor now")
            elif kind == "parameterized":
                print("Job is parameterized: each dispatch is evaluated then; nothing to monitor now")
            else:
                print("No evaluation was created: nothing to monitor")
            return 0
        print(f'Job "{job_pb.id}" registered (version {resp.version}), evaluation {resp.eval_id}')
        _print_register_warnings(resp.warnings)
        if args.detach:
            return 0
        return _monitor_eval(client, args, resp.eval_id)


def _print_register_warnings(warnings: str) -> None:
    if warnings:
        print(f"Warnings: {warnings}")


def _template_kind(job: structs_pb2.Job) -> str:
    """What kind of template the job is ("periodic", "parameterized"), or "" for neither.

    The server registers a template without an evaluation: its children get the evals."""
    if job.HasField("periodic"):
        return "periodic"
    if job.HasField("parameterized") and not job.dispatched:
        return "parameterized"
    return ""


def _cmd_job_plan(args: argparse.Namespace) -> int:
    job_pb = _load_job_file(args.file)
    with _client(args) as client:
        plan = client.plan_job(job_pb)
        if args.json:
            print_json(plan)
            return 0
        # current_version is 0 both for a new job and for an existing job at version 0.
        new = not _job_exists(client, job_pb.id, job_pb.namespace)
    print(plan_header(job_pb.id, new=new, changed=plan.job_changed, current_version=plan.current_version))
    if plan.warnings:
        print("Warnings:")
        for warning in plan.warnings:
            print(f"  - {warning}")
    kind = _template_kind(job_pb)
    if kind and not plan.groups:
        print(
            f"\nJob is {kind}: registering it places no allocations by itself;"
            " each child job it launches is scheduled then."
        )
        return 0
    group_order = [g.name for g in job_pb.groups]
    # Every group of the job gets a row (all zeros if the scheduler reported nothing for it).
    groups: dict[str, dict[str, int]] = {g: {} for g in group_order}
    groups.update((g, dict(gp.buckets)) for g, gp in plan.groups.items())
    headers, rows = plan_table(groups, group_order)
    print()
    print_table(headers, rows, empty="No task groups to schedule")
    queued = {g: n for g, n in plan.queued.items() if n > 0}
    print()
    if queued:
        order = [g for g in group_order if g in queued] + sorted(g for g in queued if g not in group_order)
        print(
            f"Scheduler dry-run: {sum(queued.values())} allocation(s) could not be placed now (would be queued):"
        )
        print_table(["Group", "Queued"], [[g, str(queued[g])] for g in order])
    else:
        print("Scheduler dry-run: all allocations can be placed.")
    return 0


def _job_exists(client: DroverClient, job_id: str, namespace: str) -> bool:
    try:
        client.get_job(job_id, namespace=namespace)
    except DroverError as exc:
        if exc.code == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


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


def _monitor_eval(client: DroverClient, args: argparse.Namespace, eval_id: str) -> int:
    """Follow an eval until it leaves "pending" or -monitor-timeout passes, printing each
    allocation it creates as it appears; then report queued allocations, a blocked eval and a
    follow-up eval. Returns the exit status; a failed eval raises :class:`CLIError`."""
    timeout_s: float = args.monitor_timeout
    deadline = time.monotonic() + timeout_s
    print(f'==> Monitoring evaluation "{_id(eval_id, args)}"')
    ev = client.get_eval(eval_id).eval
    if ev.job_id:
        print(f'    Evaluation triggered by job "{ev.job_id}"')
    elif ev.node_id:
        print(f'    Evaluation triggered by node "{_id(ev.node_id, args)}"')
    print(f'    Evaluation status "{ev.status}"')
    watcher = _AllocWatcher(client, ev, args)
    while ev.status == "pending":
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            watcher.poll(0)
            print(
                f'==> Evaluation "{_id(eval_id, args)}" still "pending" after {timeout_s:g}s; stopped monitoring'
            )
            print(f'    Run "drover eval status {eval_id}" to check on it')
            return 0
        # Blocks until the job's allocs change (or a short wait passes), then re-reads the eval.
        watcher.poll(min(remaining, _MONITOR_WAIT_S))
        latest = client.get_eval(eval_id).eval
        if latest.status != ev.status:
            print(f'    Evaluation status changed: "{ev.status}" -> "{latest.status}"')
        ev = latest
    # The eval's allocs are committed before the eval is marked done: one last look.
    watcher.poll(0)
    return _report_eval_outcome(ev, args)


class _AllocWatcher:
    """Prints each allocation of one eval the first time it shows up in the job's allocs,
    read with blocking queries on the alloc table's index."""

    def __init__(self, client: DroverClient, ev: structs_pb2.Evaluation, args: argparse.Namespace) -> None:
        self.client = client
        self.ev = ev
        self.args = args
        self.index = 0
        self.seen: set[str] = set()

    def poll(self, wait_s: float) -> None:
        """Read the job's allocs, blocking up to ``wait_s`` for a change (0: do not block)."""
        start = time.monotonic()
        if not self.ev.job_id:
            time.sleep(min(max(wait_s, 0.0), _MONITOR_POLL_S))
            return
        blocking = wait_s > 0 and self.index > 0
        resp = self.client.list_allocs(
            job_id=self.ev.job_id,
            namespace=self.ev.namespace,
            min_index=self.index if blocking else 0,
            wait_ns=max(int(wait_s * 1e9), 1) if blocking else 0,
        )
        for alloc in sorted(resp.allocs, key=lambda a: (a.create_index, a.name, a.id)):
            if alloc.eval_id != self.ev.id or alloc.id in self.seen:
                continue
            self.seen.add(alloc.id)
            where = f'node "{_id(alloc.node_id, self.args)}", group "{alloc.task_group}"'
            if alloc.create_index and alloc.create_index < self.ev.create_index:
                # Older than the eval: an existing alloc this eval updated in place.
                print(f'    Allocation "{_id(alloc.id, self.args)}" modified: {where}')
            elif alloc.desired_status == "run":
                print(f'    Allocation "{_id(alloc.id, self.args)}" created: {where}')
        if wait_s > 0 and resp.meta.index <= self.index:
            # The server answered without blocking (or the wait ran out): do not spin.
            time.sleep(max(min(_MONITOR_POLL_S, wait_s - (time.monotonic() - start)), 0.0))
        self.index = max(self.index, resp.meta.index)


def _report_eval_outcome(ev: structs_pb2.Evaluation, args: argparse.Namespace) -> int:
    queued = {g: n for g, n in ev.queued_allocations.items() if n > 0}
    incomplete = bool(queued or ev.failed_tg_allocs)
    suffix = " but failed to place all allocations:" if incomplete else ""
    print(f'==> Evaluation "{_id(ev.id, args)}" finished with status "{ev.status}"{suffix}')
    for group in sorted(set(queued) | set(ev.failed_tg_allocs)):
        count = queued.get(group, 0)
        what = f": {count} allocation(s) queued, could not be placed now" if count else ""
        print(f'    Task Group "{group}"{what}')
        if reason := ev.failed_tg_allocs.get(group, ""):
            print(f"      * {reason}")
    if ev.status_description:
        print(f"    {ev.status_description}")
    if ev.blocked_eval:
        print(
            f'    Evaluation "{_id(ev.blocked_eval, args)}" waiting for additional capacity'
            " to place the remainder"
        )
    elif ev.status == "blocked":
        print("    Evaluation is blocked: queued allocations are placed when capacity frees up")
    if ev.next_eval:
        print(f'    Follow-up evaluation "{_id(ev.next_eval, args)}" created')
    if ev.status == "failed":
        detail = f": {ev.status_description}" if ev.status_description else ""
        raise CLIError(f'evaluation "{_id(ev.id, args)}" failed{detail}')
    return 0


def _cmd_job_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if not args.job:
            listing = client.list_jobs(namespace=args.namespace, stale=args.stale)
            if args.json:
                print_json(listing.jobs)
                return 0
            rows = [
                [j.id, j.type, str(j.priority), j.status, fmt_time(j.submit_time_ns)]
                for j in sorted(listing.jobs, key=lambda j: j.id)
            ]
            print_table(["ID", "Type", "Priority", "Status", "Submit Date"], rows, empty="No jobs")
            return 0
        got = _get_job(client, args)
        job = got.job
        allocs = client.list_allocs(job_id=job.id, namespace=job.namespace, stale=args.stale).allocs
        if args.json:
            print_json({"job": got.job, "summary": got.summary, "allocations": allocs})
            return 0
        print_kv(
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
                ("Submit Date", fmt_time(job.submit_time_ns)),
            ]
        )
        kind = _template_kind(job)
        if kind:
            _print_parent_status(client, args, job, got.summary, kind)
            return 0
        print("\nSummary")
        states = ("queued", "starting", "running", "failed", "complete", "lost", "unknown")
        summary_rows = [
            [name, *(str(getattr(tg, state)) for state in states)]
            for name, tg in sorted(got.summary.summary.items())
        ]
        print_table(["Task Group", *(s.capitalize() for s in states)], summary_rows, empty="No summary")
        children = got.summary.children
        if children.pending or children.running or children.dead:
            print("\nChildren Job Summary")
            print_table(
                ["Pending", "Running", "Dead"],
                [[str(children.pending), str(children.running), str(children.dead)]],
            )
        print("\nAllocations")
        _print_allocs_table(allocs, args)
    return 0


_RECENT_CHILDREN: Final = 10


def _print_parent_status(
    client: DroverClient,
    args: argparse.Namespace,
    job: structs_pb2.Job,
    summary: structs_pb2.JobSummary,
    kind: str,
) -> None:
    """A periodic or parameterized parent: its schedule or parameters, children counts and
    its most recent children (all of them with -verbose)."""
    from scheduler.periodic import SECOND_NS, launch_ns_from_id, next_periodic_launch
    from scheduler.structs import PeriodicConfig
    from server.codec import from_proto

    if kind == "periodic":
        periodic = from_proto(job.periodic, PeriodicConfig)
        if job.stop:
            next_text = "none (job stopped)"
        elif not periodic.enabled:
            next_text = "none (periodic disabled)"
        else:
            now = time.time_ns()
            try:
                upcoming = next_periodic_launch(periodic, now)
            except ValueError as exc:
                upcoming, next_text = None, f"unknown ({exc})"
            else:
                next_text = "none"
            if upcoming is not None:
                next_text = f"{fmt_time(upcoming)} ({fmt_duration(upcoming - now - (upcoming - now) % SECOND_NS)} from now)"
        print("\nPeriodic")
        print_kv(
            [
                ("Cron", ", ".join(periodic.schedules())),
                ("Time Zone", periodic.time_zone),
                ("Prohibit Overlap", str(periodic.prohibit_overlap).lower()),
                ("Next Periodic Launch", next_text),
            ]
        )
    else:
        params = job.parameterized
        print("\nParameterized Job")
        print_kv(
            [
                ("Payload", params.payload or "optional"),
                ("Required Metadata", ", ".join(params.meta_required) or "<none>"),
                ("Optional Metadata", ", ".join(params.meta_optional) or "<none>"),
            ]
        )
    children = summary.children
    print("\nChildren Job Summary")
    print_table(
        ["Pending", "Running", "Dead"], [[str(children.pending), str(children.running), str(children.dead)]]
    )
    listing = client.list_jobs(prefix=f"{job.id}/", namespace=job.namespace, stale=args.stale).jobs
    mine = sorted(
        (c for c in listing if c.parent_id == job.id), key=lambda c: (c.create_index, c.id), reverse=True
    )
    shown = mine if args.verbose else mine[:_RECENT_CHILDREN]
    title = "Recent Launches" if kind == "periodic" else "Recent Dispatches"
    print(f"\n{title}")
    rows = []
    for child in shown:
        launched = launch_ns_from_id(child.id) if kind == "periodic" else None
        rows.append([child.id, child.status, fmt_time(launched or child.submit_time_ns)])
    empty = "No instances of periodic job found" if kind == "periodic" else "No dispatched instances found"
    print_table(["ID", "Status", "Launched"], rows, empty=empty)
    if len(shown) < len(mine):
        print(f"({len(mine) - len(shown)} older children not shown; -verbose lists all)")


def _cmd_job_stop(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _get_job(client, args).job
        resp = client.deregister_job(job.id, namespace=job.namespace, purge=args.purge)
        if args.json:
            print_json(resp)
            return 0
        verb = "purged" if args.purge else "stopped"
        print(f'Job "{job.id}" {verb}, evaluation {resp.eval_id or "(none)"}')
        if not args.detach and resp.eval_id:
            return _monitor_eval(client, args, resp.eval_id)
    return 0


def _cmd_job_allocs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _get_job(client, args).job
        allocs = client.list_allocs(job_id=job.id, namespace=job.namespace, stale=args.stale).allocs
        if args.json:
            print_json(allocs)
            return 0
        _print_allocs_table(allocs, args)
    return 0


def _cmd_job_dispatch(args: argparse.Namespace) -> int:
    meta = _parse_meta(args.meta or [])
    payload = b""
    if args.payload == "-":
        payload = sys.stdin.buffer.read()
    elif args.payload:
        with open(args.payload, "rb") as fh:
            payload = fh.read()
    with _client(args) as client:
        resp = client.dispatch_job(
            args.job,
            namespace=args.namespace,
            meta=meta,
            payload=payload,
            idempotency_token=args.idempotency_token,
        )
        if args.json:
            print_json(resp)
            return 0
        print(f'Dispatched job "{resp.dispatched_job_id}", evaluation {_id(resp.eval_id, args)}')
        if args.detach:
            return 0
        return _monitor_eval(client, args, resp.eval_id)


def _cmd_job_periodic_force(args: argparse.Namespace) -> int:
    with _client(args) as client:
        resp = client.periodic_force(args.job, namespace=args.namespace)
        if args.json:
            print_json(resp)
            return 0
        print(
            f'Force periodic successful: launched job "{resp.child_job_id}", evaluation {_id(resp.eval_id, args)}'
        )
        if args.detach:
            return 0
        return _monitor_eval(client, args, resp.eval_id)


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
                for n in nodes:
                    n.ClearField("secret_id")
                print_json(nodes)
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
            print_table(
                ["ID", "DC", "Name", "Class", "Drain", "Eligibility", "Status"], rows, empty="No nodes"
            )
            return 0
        node = client.get_node(_resolve_node(client, args.node, args.stale), stale=args.stale).node
        allocs = client.list_allocs(node_id=node.id, stale=args.stale).allocs
        if args.json:
            # The secret authenticates the node's client agent: never print it.
            node.ClearField("secret_id")
            print_json({"node": node, "allocations": allocs})
            return 0
        drain = "false"
        if node.HasField("drain_strategy"):
            ds = node.drain_strategy
            drain = f"true; deadline {_drain_deadline(ds.deadline_ns)}"
            if ds.force_deadline_at_ns:
                drain += f" (at {fmt_time(ds.force_deadline_at_ns)})"
        res = node.resources
        print_kv(
            [
                ("ID", node.id),
                ("Name", node.name),
                ("Class", node.node_class or "<none>"),
                ("DC", node.datacenter),
                ("Address", node.address),
                ("Drain", drain),
                ("Eligibility", node.scheduling_eligibility),
                ("Status", node.status),
                ("Status Description", node.status_description or "<none>"),
                ("Status Updated", fmt_time(node.status_updated_at_ns)),
                ("Resources", f"cpu {res.cpu_mhz} MHz, memory {res.memory_mb} MiB, disk {res.disk_mb} MiB"),
            ]
        )
        print("\nNode Events")
        events = sorted(node.events, key=lambda e: (e.timestamp_ns, e.create_index), reverse=True)
        shown = events if args.verbose else events[:_NODE_EVENTS_SHOWN]
        rows = [[fmt_time(e.timestamp_ns), e.subsystem, e.message] for e in shown]
        print_table(["Time", "Subsystem", "Message"], rows, empty="No events")
        if len(shown) < len(events):
            print(f"({len(events) - len(shown)} older events not shown; -verbose shows all)")
        print("\nAllocations")
        _print_allocs_table(allocs, args)
    return 0


def _cmd_node_drain(args: argparse.Namespace) -> int:
    strategy: structs_pb2.DrainStrategy | None = None
    if args.enable:
        if args.keep_ineligible:
            raise CLIError("-keep-ineligible only applies with -disable")
        chosen = [
            f
            for f, on in (
                ("-deadline", args.deadline is not None),
                ("-no-deadline", args.no_deadline),
                ("-force", args.force),
            )
            if on
        ]
        if len(chosen) > 1:
            raise CLIError(f"{' and '.join(chosen)} can not be combined")
        if args.force:
            deadline_ns = _FORCE_DRAIN_DEADLINE_NS
        elif args.no_deadline:
            deadline_ns = 0
        else:
            deadline_ns = parse_duration_ns(args.deadline or "1h")
            if deadline_ns <= 0:
                raise CLIError(
                    f'-deadline must be positive, got "{args.deadline}" (see -no-deadline, -force)'
                )
        strategy = structs_pb2.DrainStrategy(deadline_ns=deadline_ns, ignore_system_jobs=args.ignore_system)
    else:
        unused = [
            f
            for f, on in (
                ("-deadline", args.deadline is not None),
                ("-no-deadline", args.no_deadline),
                ("-force", args.force),
                ("-ignore-system", args.ignore_system),
            )
            if on
        ]
        if unused:
            raise CLIError(f"{', '.join(unused)} only appl{'ies' if len(unused) == 1 else 'y'} with -enable")
    with _client(args) as client:
        node_id = _resolve_node(client, args.node, False)
        if strategy is not None:
            resp = client.update_drain(node_id, strategy)
        else:
            resp = client.update_drain(node_id, None, mark_eligible=not args.keep_ineligible)
        if args.json:
            print_json(resp)
            return 0
        if strategy is None:
            still = " (still ineligible for scheduling)" if args.keep_ineligible else ""
            print(f'Node "{_id(node_id, args)}" drain strategy unset{still}')
        else:
            print(
                f'Node "{_id(node_id, args)}" drain strategy set'
                f" (deadline {_drain_deadline(strategy.deadline_ns)});"
                " the node is ineligible for scheduling until the drain is disabled"
            )
        if resp.eval_ids:
            print(f"Evaluations created: {', '.join(_id(e, args) for e in resp.eval_ids)}")
    return 0


def _drain_deadline(deadline_ns: int) -> str:
    if deadline_ns < 0 or deadline_ns == _FORCE_DRAIN_DEADLINE_NS:
        return "force"
    return fmt_duration(deadline_ns)


def _cmd_node_eligibility(args: argparse.Namespace) -> int:
    eligibility = "eligible" if args.enable else "ineligible"
    with _client(args) as client:
        node_id = _resolve_node(client, args.node, False)
        resp = client.update_eligibility(node_id, eligibility)
        if args.json:
            print_json(resp)
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
            print_json(evals)
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
        print_table(headers, rows, empty="No evaluations")
    return 0


def _cmd_eval_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        ev = _get_by_prefix(
            "evaluation",
            args.eval,
            lambda i: client.get_eval(i, stale=args.stale).eval,
            lambda: [e.id for e in client.list_evals(stale=args.stale).evals],
        )
        allocs: list[structs_pb2.Allocation] = []
        if ev.job_id:
            listing = client.list_allocs(job_id=ev.job_id, namespace=ev.namespace, stale=args.stale)
            allocs = [a for a in listing.allocs if a.eval_id == ev.id]
    if args.json:
        print_json({"eval": ev, "allocations": allocs})
        return 0
    none = "<none>"
    print_kv(
        [
            ("ID", ev.id),
            ("Status", ev.status),
            ("Status Description", ev.status_description or none),
            ("Type", ev.type),
            ("Triggered By", ev.triggered_by),
            ("Job ID", ev.job_id or none),
            ("Namespace", ev.namespace or none),
            ("Node ID", _id(ev.node_id, args) if ev.node_id else none),
            ("Priority", str(ev.priority)),
            ("Create Time", fmt_time(ev.create_time_ns)),
            ("Modify Time", fmt_time(ev.modify_time_ns)),
            ("Wait Until", fmt_time(ev.wait_until_ns) if ev.wait_until_ns else none),
            ("Previous Eval", _id(ev.previous_eval, args) if ev.previous_eval else none),
            ("Next Eval", _id(ev.next_eval, args) if ev.next_eval else none),
            ("Blocked Eval", _id(ev.blocked_eval, args) if ev.blocked_eval else none),
        ]
    )
    queued = {g: n for g, n in ev.queued_allocations.items() if n > 0}
    if queued:
        print("\nQueued Allocations (could not be placed)")
        print_table(["Task Group", "Queued"], [[g, str(n)] for g, n in sorted(queued.items())])
    if ev.failed_tg_allocs:
        print("\nFailed Placements")
        rows = [[g, reason] for g, reason in sorted(ev.failed_tg_allocs.items())]
        print_table(["Task Group", "Reason"], rows)
    print("\nAllocations")
    _print_allocs_table(allocs, args)
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
            print_json(alloc)
            return 0
        print_kv(
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
                ("Created", fmt_time(alloc.create_time_ns)),
                ("Modified", fmt_time(alloc.modify_time_ns)),
                ("Previous Allocation", alloc.previous_allocation or "<none>"),
                ("Next Allocation", alloc.next_allocation or "<none>"),
            ]
        )
        for name, state in sorted(alloc.task_states.items()):
            print(f'\nTask "{name}" is "{state.state}"' + (" (failed)" if state.failed else ""))
            print(
                f"Restarts: {state.restarts}  Started: {fmt_time(state.started_at_ns) or '-'}"
                f"  Finished: {fmt_time(state.finished_at_ns) or '-'}"
            )
            rows = [[fmt_time(e.time_ns), e.type, e.message] for e in state.events]
            print_table(["Time", "Type", "Description"], rows, empty="No events")
        if alloc.state_history:
            print("\nClient Status History")
            rows = [[fmt_time(c.time_ns), c.field, c.value] for c in alloc.state_history]
            print_table(["Time", "Field", "Value"], rows)
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
            print_json(resp)
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
        print_table(["Node", "Raft Address", "gRPC Address", "State", "Voter", "Connected"], rows)
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


def _cmd_reconcile_summaries(args: argparse.Namespace) -> int:
    with _client(args) as client:
        resp = client.reconcile_summaries()
    if args.json:
        print_json(resp)
        return 0
    if not resp.corrections:
        print(f"Job summaries reconciled at index {resp.meta.index}: all were exact, nothing corrected")
        return 0
    print(f"Job summaries reconciled at index {resp.meta.index}: corrected {len(resp.corrections)} job(s)")
    for correction in resp.corrections:
        print(f'  Job "{correction.job_id}" ({correction.namespace})')
        for change in correction.changes:
            print(f"    {change}")
    return 0


def _offline(fn: Callable[[], int]) -> int:
    """Run an offline tool: its errors are one-line CLI errors; logs go to stderr."""
    from server.logs import configure_logging
    from server.raft_tools import OfflineError

    configure_logging(level="error")
    try:
        return fn()
    except OfflineError as exc:
        raise CLIError(str(exc)) from exc


def _cmd_raft_logs(args: argparse.Namespace) -> int:
    import json

    from server.raft_tools import log_entries, open_data_dir

    def run() -> int:
        with open_data_dir(args.data_dir) as data:
            for entry in log_entries(data):
                print(json.dumps(entry, indent=2 if args.pretty else None, sort_keys=False))
        return 0

    return _offline(run)


def _cmd_raft_state(args: argparse.Namespace) -> int:
    import json

    from server.raft_tools import open_data_dir, state_json

    def run() -> int:
        with open_data_dir(args.data_dir) as data:
            doc = state_json(data, args.last_index)
        print(json.dumps(doc, indent=2))
        return 0

    return _offline(run)


def _cmd_snapshot_inspect(args: argparse.Namespace) -> int:
    import json

    from server.raft_tools import inspect_snapshot

    def run() -> int:
        info = inspect_snapshot(args.file)
        if args.json:
            print(json.dumps(info, indent=2))
            return 0
        pairs = [("File", info["file"]), ("Format", info["format"]), ("Index", str(info["index"]))]
        if "last_entry" in info:
            pairs.append(
                ("Raft Last Entry", f"index {info['last_entry']['index']}, term {info['last_entry']['term']}")
            )
        pairs.append(("Size", f"{info['size']} bytes"))
        print_kv(pairs)
        print()
        tables = sorted(info["tables"], key=lambda t: (-t["size"], t["name"]))
        rows = [[t["name"], str(t["count"]), str(t["size"])] for t in tables]
        rows.append(["Total", str(sum(t["count"] for t in tables)), str(sum(t["size"] for t in tables))])
        print_table(["Table", "Count", "Size"], rows)
        return 0

    return _offline(run)


def _cmd_operator_state(args: argparse.Namespace) -> int:
    """Ask each addressed server for its own digest (StateDigest is never forwarded)."""
    addresses = parse_addresses(_address(args))
    if len(addresses) == 1:
        with _client(args) as client:
            resp = client.state_digest()
        if args.json:
            print_json(resp)
        else:
            print_kv(
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
        print_json(
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
        print_table(["Address", "Server", "Leader", "Term", "Applied", "Commit", "Digest"], rows)
    if failed:
        return _fail(f"{failed} of {len(addresses)} servers did not answer")
    return 0


def _cmd_operator_invariants(args: argparse.Namespace) -> int:
    """Ask each addressed server to check its own state (Invariants is never forwarded);
    exit 1 when any reports a violation or does not answer."""
    answers: list[tuple[str, api_pb2.InvariantsResponse | DroverError]] = []
    for addr in parse_addresses(_address(args)):
        with DroverClient(addr, retry_deadline=args.retry_deadline) as client:
            try:
                answers.append((addr, client.invariants()))
            except DroverError as exc:
                answers.append((addr, exc))
    failed = sum(isinstance(a, DroverError) for _, a in answers)
    violations = sum(len(a.violations) for _, a in answers if isinstance(a, api_pb2.InvariantsResponse))
    if args.json:
        print_json(
            [a if isinstance(a, Message) else {"address": addr, "error": str(a)} for addr, a in answers]
        )
    else:
        for addr, a in answers:
            if isinstance(a, DroverError):
                print(f"{addr}: ERROR: {a}")
                continue
            verdict = f"{len(a.violations)} violation(s)" if a.violations else "no violations"
            print(f"{a.server} ({addr}) at index {a.index}: {verdict}")
            for violation in a.violations:
                print(f"  {violation}")
    if failed:
        return _fail(f"{failed} of {len(answers)} servers did not answer")
    return 1 if violations else 0


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
    return short_id(value, verbose)


def _print_allocs_table(allocs: Iterable[structs_pb2.Allocation], args: argparse.Namespace) -> None:
    rows = alloc_rows(allocs, getattr(args, "verbose", False))
    print_table(ALLOC_HEADERS, rows, empty="No allocations placed")


if __name__ == "__main__":
    sys.exit(main())
