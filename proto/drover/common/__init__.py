"""What every drover process shares: the server, the client agent, the CLI and the SDK.

Layout:

- ``logs``: the structlog setup (JSON lines in production, key=value in dev).
- ``duration``: Go's ``time.ParseDuration``, the one duration syntax of job files, agent
  flags, driver configs and the CLI.
- ``grpc_options``: the gRPC options both ends of every drover connection must agree on.
- ``secrets``: bearer secrets (tokens, node secrets): made, hashed for storage, compared.
- ``tls``: TLS on every gRPC connection, from PEM files (the server's port, its forwarding
  channel, client agents, the SDK, the CLI); ``certs``: the CA and certificates that
  ``drover tls`` writes.
- ``taskstate``: a task's state and events, the one record the client agent reports and the
  servers keep inside each alloc; pure, so the scheduler may import it (and no other module
  here).
- ``http_endpoint``: the agents' HTTP port (metrics, leader, health), GET routes on a
  standard-library server; ``prometheus``: an agent's own metrics registry and the scrape.

Its own package because the client agent may not import ``server`` (nor ``scheduler``):
this package imports only the standard library and third-party libraries, so each of them
may import it (tests/unit/test_common.py). Nomad keeps the same kind of code in ``helper/``.
"""
