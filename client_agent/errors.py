"""The client agent's errors, one tree; gRPC errors are translated in ``rpc`` only.

ClientAgentError
├── RpcFailed                 a call to the servers did not succeed
│   ├── ServerUnreachable     UNAVAILABLE / DEADLINE_EXCEEDED: try another server later
│   └── RequestRejected       the server answered with an error (carries the status name)
│       ├── NotFound          NOT_FOUND: an unknown node (heartbeat) or alloc (update)
│       └── Refused           FAILED_PRECONDITION / PERMISSION_DENIED: the servers will
│                             not hear this node until it registers again
├── TaskStartError            a driver could not start a task (counts as a task failure)
│   └── DriverConfigError     the task's driver config is invalid
└── StateError                local state in data_dir cannot be read or written
"""

from __future__ import annotations

__all__ = [
    "ClientAgentError",
    "DriverConfigError",
    "NotFound",
    "Refused",
    "RequestRejected",
    "RpcFailed",
    "ServerUnreachable",
    "StateError",
    "TaskStartError",
]


class ClientAgentError(Exception):
    """Base of every error the client agent raises on purpose."""


class RpcFailed(ClientAgentError):
    def __init__(self, address: str, code: str, message: str) -> None:
        super().__init__(f"{address}: {code}: {message}")
        self.address = address
        self.code = code
        self.message = message


class ServerUnreachable(RpcFailed):
    """No answer from the server (down, partitioned, no leader): retry elsewhere, later."""


class RequestRejected(RpcFailed):
    """The server answered and refused the request."""


class NotFound(RequestRejected):
    """NOT_FOUND: the servers do not know the node (or one of the allocs) named."""


class Refused(RequestRejected):
    """The servers refuse this node's updates until it registers again (marked down)."""


class TaskStartError(ClientAgentError):
    """A driver could not start a task."""


class DriverConfigError(TaskStartError):
    """The task's driver config does not parse or names unknown keys."""


class StateError(ClientAgentError):
    """Local state cannot be read or written."""
