"""drover's server-side errors, and their one mapping to gRPC status codes.

    DroverError
    ├── ValidationError      bad input; names the field          -> INVALID_ARGUMENT
    ├── NotFoundError        no such job/node/alloc/eval          -> NOT_FOUND
    ├── ConflictError        check-and-set or state refusal       -> FAILED_PRECONDITION
    ├── PermissionDeniedError  wrong node secret                  -> PERMISSION_DENIED
    ├── ResourceExhaustedError  over a caller's rate or parking limit -> RESOURCE_EXHAUSTED
    └── RaftError            could not commit                     -> INTERNAL
        ├── NotLeaderError   this server is not the leader        -> UNAVAILABLE (retryable)
        ├── NoLeaderError    no leader known / leadership moved   -> UNAVAILABLE (retryable)
        ├── CommitTimeoutError  outcome unknown                   -> DEADLINE_EXCEEDED
        └── MembershipBusyError  a membership change could not start -> ABORTED

drover.scheduler.validate.ValidationError is translated at the API boundary (server/api/).
"""

from __future__ import annotations

import grpc


class DroverError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ValidationError(DroverError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(DroverError):
    code = grpc.StatusCode.NOT_FOUND


class ConflictError(DroverError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDeniedError(DroverError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(DroverError):
    """Refused before any work was done, so the same call may be retried after a pause."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class RaftError(DroverError):
    code = grpc.StatusCode.INTERNAL


class NotLeaderError(RaftError):
    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class NoLeaderError(RaftError):
    code = grpc.StatusCode.UNAVAILABLE


class CommitTimeoutError(RaftError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class MembershipBusyError(RaftError):
    """A membership change or leadership transfer that did not start (the previous change
    is not committed yet, the follower is not caught up): nothing changed, retry later."""

    code = grpc.StatusCode.ABORTED
