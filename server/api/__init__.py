"""The gRPC API: one servicer module per drover service, on one grpc.aio loop.

- ``grpc_server``: assembles the server (services, health, reflection, interceptors) and
  sizes its pools; ``_aio`` bridges grpc.aio and the sync servicers (which call runs in
  the pool, a thread of its own, or on the loop).
- ``_base``: what every servicer shares: ``rpc`` (rate limits, ACL check, errors to status
  codes, leader forwarding), blocking queries; ``_park`` / ``_notify``: a blocking query or
  a read's leadership confirmation waits on the loop, not in a thread; ``_limits``: what one
  caller may park and spend; ``_decode``: requests that do not decode.
- Servicers: ``jobs``, ``nodes`` (registration, heartbeats, the client's alloc watch),
  ``evals_allocs``, ``deployments``, ``operator`` (raft, snapshots, members, scheduler
  config), ``acl``, ``events`` (the event stream), ``services``, ``tunnel`` (the node
  tunnel and the RPCs relayed down it), ``health`` (honest gRPC health).

Who may call what is server/acl/rights.py's table; docs/SECURITY.md says it in prose.
"""
