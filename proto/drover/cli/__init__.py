"""The ``drover`` command line: agents, jobs, nodes, evals, allocs and operator commands.

Flags are Nomad-style single-dash words (``-address``, ``-json``); the double-dash spelling
works too, as does ``-flag=value``. Common flags go after the command: ``drover job status
-json web``.

Contract for scripts: expected failures (bad job file, unknown ID, server errors, no leader
after retries, an address where no server answers) exit 1 with exactly one line
``Error: <message>`` on stderr and nothing on stdout after it; argparse usage errors exit
2. ``-json`` prints every field of each protobuf message, so a script never has to ask
whether a key is there: snake_case keys as in the proto, in its order; zero values
included (``0``, ``""``, ``false``, ``[]``, ``{}``); an unset sub-message as ``null``;
64-bit integers as JSON numbers, not ProtoJSON's strings (``_format.message_json``).

Map of the package, one module per command group; each has a ``register(top)`` that adds
its commands to the parser, and the handlers that run them:

- ``agent``: ``drover agent -dev|-server|-client``, the agents themselves.
- ``job``: ``run``, ``plan``, ``status``, ``stop``, ``allocs``, ``dispatch``,
  ``periodic force``; and over versions and rollouts (``_job_lifecycle``): ``history``,
  ``revert``, ``scale``, ``inspect``, ``validate``, ``deployments``.
- ``deployment``: ``list``, ``status``, ``promote``, ``pause``, ``resume``, ``fail``,
  ``alloc-health``.
- ``node``: ``status``, ``drain``, ``eligibility``; ``meta apply|read`` (``_node_meta``);
  ``pool list|info`` (``node_pool``).
- ``eval``: ``list``, ``status``.
- ``alloc``: ``status``, ``stop``; ``logs``, ``restart``, ``signal`` through the node's
  tunnel (``_alloc_control``).
- ``service``: ``list``, ``info``: native service registrations.
- ``server``: ``members``.
- ``event``: ``stream``, the event stream as one JSON object a line.
- ``system``: ``reconcile summaries``.
- ``operator``: ``raft list-peers|logs|state``, ``snapshot save|restore|inspect``,
  ``state``, ``invariants``; ``scheduler get-config|set-config`` (``_scheduler_config``).
- ``acl``: ``bootstrap``, ``policy apply|list|info|delete``,
  ``token create|list|info|self|delete`` (servers with ``-acl-enabled``; every command
  sends ``-token`` or ``DROVER_TOKEN``).
- ``tls``: ``ca create``, ``cert create``: a private CA and the cluster's certificates.
- ``info``: ``agent-info`` and ``version`` (and the top-level ``-version``).

Shared, private:

- ``_parser``: the whole parser, built from the groups' ``register``.
- ``_args``: flag spellings and the common flag sets; reading ``-address``, ``-verbose``.
- ``_connect``: the SDK client from the flags; finding a record by ID prefix.
- ``_errors``: :class:`CLIError` and the one boundary that turns failures into one line.
- ``_monitor``: following an evaluation after a write, then the deployment it starts.
- ``_jobs``: reading a job file and converting it for the wire; finding a job by ID prefix.
- ``_deployments``, ``_jobdiff``, ``_placement``: how deployments, version diffs and
  placement metrics read (pure).
- ``_format``: tables, key = value lists, JSON, times, durations; nothing there talks to
  a server.

The SDK the commands call is ``drover.sdk``, a module of its own.
"""

from __future__ import annotations

import sys

from drover.cli._errors import CLIError, Handler, run_handler
from drover.cli._format import format_table, parse_duration_ns
from drover.cli._parser import build_parser

__all__ = ["CLIError", "build_parser", "format_table", "main", "parse_duration_ns"]


def main(argv: list[str] | None = None) -> int:
    """The ``drover`` entry point; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    handler: Handler = args.handler
    return run_handler(handler, args)
