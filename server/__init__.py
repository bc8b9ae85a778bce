"""drover's server: the replicated state, the leader's loop, and the API that fronts them.

How a write travels (docs/design.md has the whole data path):
API handler (``api/``) -> ``endpoints`` checks it and builds one raft entry ->
``write_batch`` packs the writes that arrive together -> ``raft/`` replicates and syncs the
log -> ``fsm`` applies each entry to the ``state_store`` on every server -> the leader's
services react to the new state.

Layout (by concern):

- The state: ``state_store`` (tables, indexes, O(1) snapshots), ``fsm`` (one entry in,
  the next state out), ``snapshot`` (the state in and out of protobuf; digests),
  ``codec`` (domain records to and from protobuf), ``invariants`` (the live checker of
  docs/design.md's state invariants).
- Writes: ``endpoints`` (check, decide IDs and times, propose), ``write_batch`` (group
  commit), ``inline`` (a write handler runs on the API loop and awaits its commit there,
  no thread of its own), ``cluster_ops`` (operator writes), ``errors`` (the one error tree and its gRPC
  codes).
- Raft: ``raft/`` (pysyncobj behind one package: the durable journal, snapshots, the
  leadership confirmations of default reads, every patch in plain view), ``membership``
  and ``autopilot`` (servers joining, leaving, dead ones removed), ``members`` (who is in).
- The leader's services, started and stopped together by ``leader``: ``broker`` (evals to
  workers), ``worker`` (run a scheduler from drover.scheduler, pure), ``plan_apply`` (the
  one serialized plan applier), ``blocked`` (evals waiting for capacity), ``heartbeat``
  (client TTLs and down nodes), ``drainer``, ``periodic``, ``deployments/`` (the watcher),
  ``gc/`` (garbage collection), ``restore_followup`` (after a snapshot restore).
- What clients and operators see: ``api/`` (the gRPC services on a grpc.aio loop; its
  ``__init__`` is its map), ``events/`` (the event stream), ``services/`` (native service
  discovery), ``tunnel/`` (what only a node can answer), ``acl/`` (policies, tokens, what
  each RPC needs), ``telemetry/`` (metrics and the HTTP port), ``loop_wakers`` (coroutines
  woken by what another thread writes).
- Job files: ``jobspec`` (HCL or JSON to a ``Job``), ``jobspec_eval`` (HCL2 variables,
  locals and functions), ``jobspec_api`` (Nomad's API JSON).
- The process: ``core`` (one server wired together), ``agent`` (signals, data dirs, clean
  shutdown), ``gc_freeze`` (the agent's long-lived objects kept out of the cyclic
  collector's walks), ``config`` (flags and config files, the same keys), ``datadir`` (the data dir
  lock), ``clock`` (injected time and IDs), ``raft_tools`` (offline tools on a stopped
  server's data dir).

Everything that decides where allocs go lives in drover.scheduler and is pure: this package
is the imperative shell around it (threads, timers, I/O).
"""
