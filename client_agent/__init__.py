"""drover's node agent: fingerprint, register, heartbeat, watch allocs, run tasks, report back.

Layout (one concept per module; only ``rpc`` talks gRPC):

- ``fingerprint``: what this host offers (resources, attributes), as a ``Node`` message.
- ``state``: local persistent state in ``data_dir`` (node identity, one record per alloc).
- ``taskstate`` / ``restarts`` / ``allocdiff`` / ``sync``: the pure decisions (the alloc
  status from its task states, whose record is ``drover.common.taskstate``; the restart
  policy; what to do with the server's alloc list; which updates to send).
- ``drivers``: ``mock`` (a timer) and ``raw_exec`` (a real process group); ``taskenv``:
  the ``DROVER_*``/``NOMAD_*`` variables a task starts with; ``interpolate``: the
  ``${node.*}``/``${attr.*}``/``${meta.*}`` names resolved on the node as a task starts.
- ``lifecycle`` (pure): when each task may start (prestart, poststart, poststop, sidecars)
  and in which waves an alloc's tasks stop (the leader first, sidecars last).
- ``taskrunner`` / ``runner``: one thread per task, one ``AllocRunner`` per alloc.
- ``templates``: the files a task gets before it starts (artifacts, the dispatch payload,
  rendered templates) and their re-render on change (``change_mode``, ``splay``, ``wait``).
- ``servicewatch`` / ``services``: one watch of service registrations per agent, fanned
  out to the allocs whose templates read them (``nomadService``).
- ``checks`` / ``checkwatch``: the service checks the client runs itself (http, tcp,
  script), for an alloc's whole life: their statuses go to the servers with the alloc, and
  ``check_restart`` restarts a task whose check keeps failing.
- ``health``: an alloc's deployment health, decided once per deployment (``decide_health``
  is pure; ``HealthTracker`` is its thread) from the task states and, with
  ``health_check = "checks"``, the checks' results, sent as the alloc's
  ``deployment_status`` (docs/deployments-health.md).
- ``rpc``: the server pool (failover, backoff) and the Nodes RPCs; ``tunnel``: the one
  ``Nodes.Connect`` stream through which the servers ask what only the node can answer
  (logs, task restarts and signals, node meta), since a client never listens on a port.
- ``metrics``: the agent's metric families and its HTTP port; ``clock``: injected time;
  ``errors``: the agent's one error tree; ``threads``: joining worker threads on a budget.
- ``config``: ``ClientSettings`` (any object with ``ClientConfig``'s attributes) and
  ``AgentTuning`` (intervals and timeouts).
- ``agent``: the shell that wires it all: ``ClientAgent``, ``run_client``,
  ``start_embedded_client``.

This package imports only ``drover.v1`` (generated protobuf), ``common`` (what every drover
process shares) and third-party libraries, never ``drover.server`` or ``drover.scheduler``.
"""
