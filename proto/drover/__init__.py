"""drover: a cluster scheduler control plane in the spirit of Nomad, as one import namespace.

The root package (proto/drover/) is the API and its clients; the implementation keeps its own
top-level folders and is mapped in (pyproject.toml, ``[tool.setuptools.package-dir]``):

- ``drover.v1``: the wire contract, generated from proto/drover/v1/*.proto (``make proto``).
- ``drover.sdk``: the typed client of that API (leader failover, retries); at import it
  needs only ``drover.v1`` and ``drover.common``. Its job-file reader uses the servers'
  own parser and rules (``drover.server.jobspec``, ``drover.scheduler.validate``),
  imported on its first call.
- ``drover.cli``: the ``drover`` command, one module per command group, over the SDK.
- ``drover.common`` (proto/drover/common/): what every process shares: the logging setup,
  Go durations. Imports no other part of drover.
- ``drover.scheduler`` (scheduler/): the pure core: reconcile, feasibility, ranking, placement.
- ``drover.server`` (server/): raft, the FSM and state store, the gRPC API, the eval broker,
  workers and the plan applier.
- ``drover.client`` (client_agent/): the node agent that runs what the servers place.
"""
