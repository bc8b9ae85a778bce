"""The committed protobuf code is exactly what the .proto files generate today.

Regenerates every module (messages, gRPC stubs and both mypy stub files) into a temporary
directory with the pinned grpcio-tools and mypy-protobuf, then compares byte for byte with
proto/drover/v1/. A .proto edited without regenerating, a hand-edited _pb2 file, or a
generated file left behind after its .proto was removed all fail here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PACKAGE = Path("drover") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _generated(root: Path) -> dict[str, bytes]:
    directory = root / PACKAGE
    return {
        path.name: path.read_bytes()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    }


def test_proto__generated_code__matches_the_proto_files(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(REPO)) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    assert protos, "no .proto files found"
    # protoc finds the mypy plugins (protoc-gen-mypy, protoc-gen-mypy_grpc) on PATH.
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            "proto",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--mypy_out={tmp_path}",
            f"--mypy_grpc_out={tmp_path}",
            *protos,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"protoc failed:\n{run.stderr}"

    fresh, committed = _generated(tmp_path), _generated(PROTO_ROOT)
    assert len(fresh) == 4 * len(protos), f"protoc wrote {sorted(fresh)}"
    assert sorted(committed) == sorted(fresh), (
        f"generated files differ from the committed set: missing {sorted(set(fresh) - set(committed))}, "
        f"stale {sorted(set(committed) - set(fresh))}: run make proto"
    )
    stale = [name for name in sorted(fresh) if fresh[name] != committed[name]]
    assert stale == [], f"committed generated code is out of date in proto/drover/v1/{stale}: run make proto"
