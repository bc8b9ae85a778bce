"""The state store in and out of protobuf: raft snapshots, `operator snapshot`, digests.

A snapshot holds only primary tables; secondary indexes and counters are rebuilt on load,
so a snapshot can never carry an index that disagrees with its rows.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import immutables

from drover.scheduler.structs import (
    Allocation,
    Deployment,
    Evaluation,
    Job,
    JobSummary,
    Node,
    PeriodicLaunch,
    SchedulerConfig,
    ServerMember,
    ServiceRegistration,
)
from drover.server.acl.records import ACLPolicy, ACLTokenRecord
from drover.server.codec import from_proto, to_proto
from drover.server.state_store import JobKey, Tables, TokenKey, dispatch_token_key
from drover.v1 import raft_pb2, structs_pb2


def _sorted(values: Iterable[Any], key: Any) -> list[Any]:
    return sorted(values, key=key)


def to_snapshot(tables: Tables) -> raft_pb2.StateSnapshot:
    snap = raft_pb2.StateSnapshot(index=tables.index)
    for node in _sorted(tables.nodes.values(), key=lambda n: n.id):
        to_proto(node, snap.nodes.add())
    for job in _sorted(tables.jobs.values(), key=lambda j: (j.namespace, j.id)):
        to_proto(job, snap.jobs.add())
    for key in sorted(tables.job_versions.keys()):
        for job in tables.job_versions[key]:
            to_proto(job, snap.job_versions.add())
    for ev in _sorted(tables.evals.values(), key=lambda e: e.id):
        to_proto(ev, snap.evals.add())
    for alloc in _sorted(tables.allocs.values(), key=lambda a: a.id):
        to_proto(alloc, snap.allocs.add())
    for summary in _sorted(tables.job_summaries.values(), key=lambda s: (s.namespace, s.job_id)):
        to_proto(summary, snap.job_summaries.add())
    for launch in _sorted(tables.periodic_launches.values(), key=lambda p: (p.namespace, p.job_id)):
        to_proto(launch, snap.periodic_launches.add())
    to_proto(tables.scheduler_config, snap.scheduler_config)
    for member in _sorted(tables.servers.values(), key=lambda m: m.name):
        to_proto(member, snap.servers.add())
    for policy in _sorted(tables.acl_policies.values(), key=lambda p: p.name):
        to_proto(policy, snap.acl_policies.add())
    for token in _sorted(tables.acl_tokens.values(), key=lambda t: t.accessor_id):
        to_proto(token, snap.acl_tokens.add())
    snap.acl_bootstrap_index = tables.acl_bootstrap_index
    for deployment in _sorted(tables.deployments.values(), key=lambda d: d.id):
        to_proto(deployment, snap.deployments.add())
    for alloc_id in sorted(tables.services.keys()):
        for registration in tables.services[alloc_id]:
            to_proto(registration, snap.services.add())
    snap.table_index.update(dict(tables.table_index.items()))
    return snap


def _index(pairs: Iterable[tuple[Any, Any]]) -> immutables.Map[Any, immutables.Map[Any, None]]:
    groups: dict[Any, dict[Any, None]] = {}
    for key, member in pairs:
        groups.setdefault(key, {})[member] = None
    return immutables.Map({k: immutables.Map(v) for k, v in groups.items()})


def from_snapshot(snap: raft_pb2.StateSnapshot) -> Tables:
    """The tables ``snap`` holds, decoded with the cyclic collector paused (see
    ``_collection_paused``)."""
    with _collection_paused():
        return _decode_tables(snap)


@contextmanager
def _collection_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a whole state is decoded.

    Decoding creates several tracked objects per alloc, and none of them is garbage: every
    few hundred of them start a collection, and each collection that reaches the oldest
    generation walks the whole heap, the state already loaded included. With 60,000 allocs
    decoded into a process already holding up to five states of that size, the load took
    3.7 s collecting and 1.6 s paused (median of 3; ``make bench``, tests/bench/state_load.py).
    Reference counting still frees what dies meanwhile; the collector starts again after.
    Process-wide: a load that finds it paused (another thread's load) leaves it paused."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _decode_tables(snap: raft_pb2.StateSnapshot) -> Tables:
    nodes = {n.id: n for n in (from_proto(m, Node) for m in snap.nodes)}
    jobs = {(j.namespace, j.id): j for j in (from_proto(m, Job) for m in snap.jobs)}
    versions: dict[tuple[str, str], list[Job]] = {}
    for m in snap.job_versions:
        job = from_proto(m, Job)
        versions.setdefault((job.namespace, job.id), []).append(job)
    evals = {e.id: e for e in (from_proto(m, Evaluation) for m in snap.evals)}
    allocs = {a.id: a for a in (from_proto(m, Allocation) for m in snap.allocs)}
    live: dict[tuple[str, str], int] = {}
    for alloc in allocs.values():
        if not alloc.terminal():
            key = (alloc.namespace, alloc.job_id)
            live[key] = live.get(key, 0) + 1
    summaries = {(s.namespace, s.job_id): s for s in (from_proto(m, JobSummary) for m in snap.job_summaries)}
    launches = {
        (p.namespace, p.job_id): p for p in (from_proto(m, PeriodicLaunch) for m in snap.periodic_launches)
    }
    servers = {s.name: s for s in (from_proto(m, ServerMember) for m in snap.servers)}
    policies = {p.name: p for p in (from_proto(m, ACLPolicy) for m in snap.acl_policies)}
    tokens = {t.accessor_id: t for t in (from_proto(m, ACLTokenRecord) for m in snap.acl_tokens)}
    deployments = {d.id: d for d in (from_proto(m, Deployment) for m in snap.deployments)}
    services: dict[str, list[ServiceRegistration]] = {}
    for service in (from_proto(m, ServiceRegistration) for m in snap.services):
        services.setdefault(service.alloc_id, []).append(service)
    config = (
        from_proto(snap.scheduler_config, SchedulerConfig)
        if snap.HasField("scheduler_config")
        else SchedulerConfig()
    )
    return Tables(
        index=snap.index,
        nodes=immutables.Map(nodes),
        jobs=immutables.Map(jobs),
        job_versions=immutables.Map({k: tuple(v) for k, v in versions.items()}),
        jobs_by_type=_index((j.type, k) for k, j in jobs.items()),
        periodic_jobs=immutables.Map({k: None for k, j in jobs.items() if j.periodic is not None}),
        children_by_parent=_index(((j.namespace, j.parent_id), k) for k, j in jobs.items() if j.parent_id),
        dispatch_tokens=_dispatch_tokens(jobs),
        evals=immutables.Map(evals),
        evals_by_job=_index(((e.namespace, e.job_id), e.id) for e in evals.values() if e.job_id),
        allocs=immutables.Map(allocs),
        allocs_by_job=_index(((a.namespace, a.job_id), a.id) for a in allocs.values()),
        allocs_by_node=_index((a.node_id, a.id) for a in allocs.values()),
        allocs_by_eval=_index((a.eval_id, a.id) for a in allocs.values()),
        live_allocs_by_job=immutables.Map(live),
        job_summaries=immutables.Map(summaries),
        periodic_launches=immutables.Map(launches),
        scheduler_config=config,
        servers=immutables.Map(servers),
        acl_policies=immutables.Map(policies),
        acl_tokens=immutables.Map(tokens),
        acl_tokens_by_hash=immutables.Map({t.secret_hash: t.accessor_id for t in tokens.values()}),
        acl_bootstrap_index=snap.acl_bootstrap_index,
        deployments=immutables.Map(deployments),
        deployments_by_job=_index(((d.namespace, d.job_id), d.id) for d in deployments.values()),
        services=immutables.Map({k: tuple(v) for k, v in services.items()}),
        services_by_name=_index(
            ((r.namespace, r.service_name), r.alloc_id) for regs in services.values() for r in regs
        ),
        table_index=immutables.Map(dict(snap.table_index)),
    )


def _dispatch_tokens(jobs: dict[JobKey, Job]) -> immutables.Map[TokenKey, JobKey]:
    """The idempotency index as the FSM built it: each token names its first child."""
    index: dict[TokenKey, JobKey] = {}
    for key, job in sorted(jobs.items(), key=lambda kv: (kv[1].create_index, kv[0])):
        token = dispatch_token_key(job)
        if token is not None:
            index.setdefault(token, key)
    return immutables.Map(index)


def snapshot_bytes(tables: Tables) -> bytes:
    return to_snapshot(tables).SerializeToString(deterministic=True)


def state_digest(tables: Tables) -> str:
    """A hash of the whole state, equal on every server at the same applied index."""
    return hashlib.sha256(snapshot_bytes(tables)).hexdigest()


# Which summary counter an alloc counts in, by its client status (Nomad's JobSummary). The
# recount's own table, not the state store's, so a wrong mapping in the store shows up as
# a difference instead of being repeated; the tests' oracle (tests/fixtures/mock.py) reads
# this one too.
RECOUNT_COUNTER_OF_CLIENT_STATUS: Final[Mapping[str, str]] = {
    "": "starting",
    "pending": "starting",
    "running": "running",
    "complete": "complete",
    "failed": "failed",
    "lost": "lost",
    "unknown": "unknown",
}


def recount_summaries(tables: Tables) -> dict[tuple[str, str], dict[str, structs_pb2.TaskGroupSummary]]:
    """Summaries recomputed from the allocs alone (queued excluded): the oracle of
    docs/design.md#invariant-2 (every summary counter equals a recount)."""
    out: dict[tuple[str, str], dict[str, structs_pb2.TaskGroupSummary]] = {}
    for alloc in tables.allocs.values():
        key = (alloc.namespace, alloc.job_id)
        if key not in tables.job_summaries:
            continue
        rows = out.setdefault(key, {})
        row = rows.setdefault(alloc.task_group, structs_pb2.TaskGroupSummary())
        name = RECOUNT_COUNTER_OF_CLIENT_STATUS.get(alloc.client_status, "starting")
        setattr(row, name, getattr(row, name) + 1)
    return out
