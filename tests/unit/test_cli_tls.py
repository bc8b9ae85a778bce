"""``drover tls ca create`` / ``drover tls cert create``, run as real processes in a temp
directory: the files Nomad's names promise, keys 0600, ``-json``, and one-line refusals."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from drover.common.tls import TLSFiles


def _drover(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drover.cli", "tls", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if not k.startswith("DROVER_")},
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def test_tls_ca_create__json_names_the_files__key_0600(tmp_path: Path) -> None:
    result = _drover(tmp_path, "ca", "create", "-json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "cert_file": "drover-agent-ca.pem",
        "key_file": "drover-agent-ca-key.pem",
    }
    assert _mode(tmp_path / "drover-agent-ca-key.pem") == 0o600
    ca = x509.load_pem_x509_certificate((tmp_path / "drover-agent-ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


@pytest.mark.parametrize("role", ["server", "client", "cli"])
def test_tls_cert_create__json__files_signed_by_the_ca_and_usable(tmp_path: Path, role: str) -> None:
    assert _drover(tmp_path, "ca", "create").returncode == 0
    result = _drover(
        tmp_path, "cert", "create", f"-{role}", "-json", "-additional-dnsname", "n1.example",
        "-additional-ipaddress", "10.1.2.3", "-days", "30",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    names = json.loads(result.stdout)
    assert names == {"cert_file": f"global-{role}-drover.pem", "key_file": f"global-{role}-drover-key.pem"}
    assert _mode(tmp_path / names["key_file"]) == 0o600
    cert = x509.load_pem_x509_certificate((tmp_path / names["cert_file"]).read_bytes())
    cert.verify_directly_issued_by(
        x509.load_pem_x509_certificate((tmp_path / "drover-agent-ca.pem").read_bytes())
    )
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {f"{role}.global.drover", "n1.example"} <= set(san.get_values_for_type(x509.DNSName))
    assert "10.1.2.3" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    # What drover itself would load from them: it parses, and the key is the cert's.
    TLSFiles(
        str(tmp_path / "drover-agent-ca.pem"),
        str(tmp_path / names["cert_file"]),
        str(tmp_path / names["key_file"]),
    ).load()


def test_tls_cert_create__without_json__says_where_it_wrote(tmp_path: Path) -> None:
    assert _drover(tmp_path, "ca", "create").returncode == 0
    result = _drover(tmp_path, "cert", "create", "-server")
    assert result.returncode == 0, result.stderr
    assert "global-server-drover.pem" in result.stdout and "global-server-drover-key.pem" in result.stdout
    assert "WARNING" in result.stderr


def test_tls_ca_create__twice__refuses_to_overwrite(tmp_path: Path) -> None:
    assert _drover(tmp_path, "ca", "create").returncode == 0
    before = (tmp_path / "drover-agent-ca.pem").read_bytes()
    assert "already exists" in _one_error_line(_drover(tmp_path, "ca", "create"))
    assert (tmp_path / "drover-agent-ca.pem").read_bytes() == before


def test_tls_cert_create__without_a_ca__one_line_says_how_to_make_one(tmp_path: Path) -> None:
    line = _one_error_line(_drover(tmp_path, "cert", "create", "-cli"))
    assert "drover-agent-ca.pem" in line and "drover tls ca create" in line
    assert list(tmp_path.iterdir()) == []


def test_tls_cert_create__bad_ip__one_line_and_no_files(tmp_path: Path) -> None:
    assert _drover(tmp_path, "ca", "create").returncode == 0
    assert "not an IP address" in _one_error_line(
        _drover(tmp_path, "cert", "create", "-client", "-additional-ipaddress", "ten")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drover-agent-ca-key.pem", "drover-agent-ca.pem"]


def test_tls_cert_create__needs_exactly_one_role(tmp_path: Path) -> None:
    assert _drover(tmp_path, "cert", "create").returncode == 2
    assert _drover(tmp_path, "cert", "create", "-server", "-cli").returncode == 2
