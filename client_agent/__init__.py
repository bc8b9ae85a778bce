"""drover's node agent: fingerprint, register, heartbeat, watch allocs, run tasks, report back.

Layout (one concept per module; only ``rpc`` talks gRPC):

- ``fingerprint``: what this host offers (resources, attributes), as a ``Node`` message.
- ``state``: local persistent state in ``data_dir`` (node identity, one record per alloc).
- ``taskstate`` / ``restarts`` / ``allocdiff`` / ``sync``: the pure decisions (task state
  transitions and the alloc status, the restart policy, what to do with the server's alloc
  list, which updates to send).
- ``drivers``: ``mock`` (a timer) and ``raw_exec`` (a real process group); ``taskenv``:
  the ``DROVER_*``/``NOMAD_*`` variables a task starts with.
- ``taskrunner`` / ``runner``: one thread per task, one ``AllocRunner`` per alloc.
- ``health`` / ``checks``: an alloc's deployment health, decided once per deployment
  (``decide_health`` is pure; ``HealthTracker`` is its thread) from the task states and,
  with ``health_check = "checks"``, the service checks the client runs itself (http, tcp,
  script), sent as the alloc's ``deployment_status`` (docs/deployments-health.md).
- ``rpc``: the server pool (failover, backoff) and the Nodes RPCs.
- ``config``: ``ClientSettings`` (any object with ``ClientConfig``'s attributes) and
  ``AgentTuning`` (intervals and timeouts).
- ``agent``: the shell that wires it all: ``ClientAgent``, ``run_client``,
  ``start_embedded_client``.

This package imports only ``drover.v1`` (generated protobuf), ``common`` (what every drover
process shares) and third-party libraries, never ``drover.server`` or ``drover.scheduler``.
"""
