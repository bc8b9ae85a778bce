"""Reading a job file the way every command that takes one does (``job run``, ``plan``,
``validate``), and finding a job by a unique prefix of its ID."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import grpc

from drover.cli._args import flag
from drover.cli._connect import no_unique_match
from drover.cli._errors import CLIError
from drover.scheduler.structs import Job
from drover.sdk import DroverClient, DroverError, JobFileError
from drover.sdk import parse_job_file as sdk_parse_job_file
from drover.server.codec import from_proto, to_proto
from drover.v1 import api_pb2, structs_pb2

__all__ = [
    "JobFileProblems",
    "get_job",
    "job_file_flags",
    "job_proto",
    "load_job_file",
    "local_errors",
    "parse_job_file",
    "with_lines",
]


def job_file_flags(p: argparse.ArgumentParser) -> None:
    """``-var`` and ``-var-file``, as Nomad's ``job run|plan|validate`` take them."""
    flag(
        p,
        "var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable of the job file (repeatable; wins over -var-file and NOMAD_VAR_NAME)",
    )
    flag(
        p,
        "var-file",
        action="append",
        default=[],
        metavar="FILE",
        help="HCL or JSON file of variable values (repeatable; a later file wins)",
    )


def _variables(args: argparse.Namespace | None) -> tuple[dict[str, str], list[str]]:
    """``-var`` as a mapping (the last of a name wins) and the ``-var-file`` paths."""
    values: dict[str, str] = {}
    for item in getattr(args, "var", None) or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CLIError(f"-var {item!r}: expected NAME=VALUE")
        values.pop(name.strip(), None)
        values[name.strip()] = value
    return values, list(getattr(args, "var_file", None) or [])


class JobFileProblems(CLIError):
    """A job file with problems; ``errors`` lists each (``web.hcl:12: ...``)."""

    def __init__(self, message: str, errors: Sequence[str]) -> None:
        super().__init__(message)
        self.errors = tuple(errors)


def parse_job_file(path: str, args: argparse.Namespace | None = None) -> Job:
    """The job a file describes (its variables from ``args``' ``-var`` and ``-var-file``
    and the environment's ``NOMAD_VAR_*``), not yet validated; a file that cannot be read
    or parsed is a :class:`JobFileProblems` naming the place of each problem. Read by the
    SDK (``drover.sdk.parse_job_file``), as ``load_job_file`` reads it, so ``job validate``
    sees the job ``job run`` would send."""
    try:
        message = _read_job_file(path, args, validate=False)
    except JobFileError as exc:
        if exc.problems:
            raise JobFileProblems(str(exc), exc.problems) from exc
        raise CLIError(str(exc)) from exc
    return from_proto(message, Job)


def _read_job_file(path: str, args: argparse.Namespace | None, *, validate: bool) -> structs_pb2.Job:
    values, var_files = _variables(args)
    return sdk_parse_job_file(
        path, validate=validate, variables=values, var_files=var_files, environ=os.environ
    )


def local_errors(job: Job) -> list[str]:
    """Every validation problem of ``job``'s canonical form, each ``path: message``."""
    from drover.scheduler.validate import ValidationError, canonicalize_job, validate_job

    try:
        validate_job(canonicalize_job(job))
    except ValidationError as exc:
        return [str(error) for error in exc.errors]
    return []


def load_job_file(path: str, args: argparse.Namespace | None = None) -> structs_pb2.Job:
    """Parse and locally validate a job file, so mistakes get a message before any RPC:
    the SDK's own reading (``drover.sdk.parse_job_file``), so a script sends what the CLI
    would."""
    try:
        return _read_job_file(path, args, validate=True)
    except JobFileError as exc:
        if exc.errors:
            raise CLIError("; ".join(with_lines(exc.errors, path))) from exc
        raise CLIError(str(exc)) from exc


def with_lines(errors: Sequence[str], path: str) -> list[str]:
    """Validation problems with the line of their field in the file (``web.hcl:4:
    job.groups[0].count: ...``), when drover's own parser is there to say it."""
    try:
        from drover.server.jobspec import (  # type: ignore[import-not-found, unused-ignore]
            locate_problems,
        )
    except ImportError:
        return list(errors)
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    located: list[str] = locate_problems(errors, text, filename=path)
    return located


def job_proto(job: Job) -> structs_pb2.Job:
    """A parsed job file as it goes on the wire: the one place the CLI converts one, so
    the commands that send a job (``run``, ``plan``, ``validate``) send the same message."""
    return to_proto(job, structs_pb2.Job())


def get_job(client: DroverClient, args: argparse.Namespace) -> api_pb2.JobGetResponse:
    """The job named exactly, or else the only job whose ID starts with the argument."""
    stale: bool = getattr(args, "stale", False)
    try:
        return client.get_job(args.job, namespace=args.namespace, stale=stale)
    except DroverError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND:
            raise
        listing = client.list_jobs(prefix=args.job, namespace=args.namespace, stale=stale)
        matches = [j.id for j in listing.jobs if j.id.startswith(args.job)]
        if len(matches) != 1:
            no_unique_match("job", args.job, matches, exc)
        return client.get_job(matches[0], namespace=args.namespace, stale=stale)
