"""Reading a job file the way every command that takes one does (``job run``, ``plan``,
``validate``), and finding a job by a unique prefix of its ID."""

from __future__ import annotations

import argparse

import grpc

from drover.cli._connect import no_unique_match
from drover.cli._errors import CLIError
from drover.scheduler.structs import Job
from drover.sdk import DroverClient, DroverError
from drover.server.codec import to_proto
from drover.v1 import api_pb2, structs_pb2

__all__ = ["get_job", "job_proto", "load_job_file", "local_errors", "parse_job_file"]


def parse_job_file(path: str) -> Job:
    """The job a file describes, not yet validated; a file that cannot be read or parsed is
    a :class:`CLIError` naming its place (``web.hcl:3,5: ...``)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CLIError(
            f"{path}: not valid UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from exc
    try:
        from drover.server.jobspec import (  # type: ignore[import-not-found, unused-ignore]
            JobspecError,
            parse_jobspec,
        )
    except ModuleNotFoundError as exc:
        if exc.name != "drover.server.jobspec":
            raise
        raise CLIError("cannot read job files: drover.server.jobspec is not available") from exc
    try:
        job: Job = parse_jobspec(text, filename=path)
    except JobspecError as exc:
        raise CLIError(str(exc)) from exc
    return job


def local_errors(job: Job) -> list[str]:
    """Every validation problem of ``job``'s canonical form, each ``path: message``."""
    from drover.scheduler.validate import ValidationError, canonicalize_job, validate_job

    try:
        validate_job(canonicalize_job(job))
    except ValidationError as exc:
        return [str(error) for error in exc.errors]
    return []


def load_job_file(path: str) -> structs_pb2.Job:
    """Parse and locally validate a job file, so mistakes get a message before any RPC."""
    job = parse_job_file(path)
    errors = local_errors(job)
    if errors:
        raise CLIError("; ".join(errors))
    # The server canonicalizes too; the job is sent as parsed.
    return job_proto(job)


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
