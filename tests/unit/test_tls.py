"""drover.common.tls (settings, file checks, real handshakes in-process) and
drover.common.certs (the CA and certificates ``drover tls`` writes)."""

from __future__ import annotations

import datetime
import stat
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from drover.common import certs
from drover.common.tls import (
    AGENT_FLAGS,
    CLI_FLAGS,
    SERVER_NAME,
    TLSError,
    TLSFiles,
    TLSMaterial,
    files_from_env,
    open_channel,
    server_credentials,
    tls_files,
)
from drover.sdk import DroverClient, DroverError

CA = certs.create_ca()
OTHER_CA = certs.create_ca()


def _write(tmp_path: Path, name: str, pair: certs.PemPair) -> tuple[str, str]:
    cert, key = str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}-key.pem")
    certs.write_pair(pair, cert, key)
    return cert, key


def _sans(pair: certs.PemPair) -> tuple[list[str], list[str]]:
    san = x509.load_pem_x509_certificate(pair.cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    return san.value.get_values_for_type(x509.DNSName), [
        str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)
    ]


# --- settings: which combinations mean what -----------------------------------------------


def test_tls_files__nothing_given__plaintext() -> None:
    assert tls_files(None, "", None) is None


def test_tls_files__ca_only__tls_without_identity() -> None:
    files = tls_files("ca.pem", None, None)
    assert files == TLSFiles("ca.pem") and files is not None and not files.has_identity


@pytest.mark.parametrize(
    ("ca", "cert", "key", "message"),
    [
        ("ca.pem", "c.pem", "", "-tls-cert-file was given without -tls-key-file"),
        ("ca.pem", "", "k.pem", "-tls-key-file was given without -tls-cert-file"),
        ("", "c.pem", "k.pem", "-tls-cert-file was given without -tls-ca-file"),
        ("", "", "k.pem", "-tls-key-file was given without -tls-ca-file"),
    ],
    ids=["cert-without-key", "key-without-cert", "cert-without-ca", "key-without-ca"],
)
def test_tls_files__half_a_setting__refused_naming_the_flags(
    ca: str, cert: str, key: str, message: str
) -> None:
    with pytest.raises(TLSError, match=message):
        tls_files(ca, cert, key, names=AGENT_FLAGS)


def test_files_from_env__flags_win_over_environment() -> None:
    env = {"DROVER_CACERT": "env-ca.pem", "DROVER_CLIENT_CERT": "env.pem", "DROVER_CLIENT_KEY": "env-key.pem"}
    assert files_from_env(env, None, None, None) == TLSFiles("env-ca.pem", "env.pem", "env-key.pem")
    assert files_from_env(env, "flag-ca.pem", None, None) == TLSFiles("flag-ca.pem", "env.pem", "env-key.pem")
    assert files_from_env({}, None, None, None) is None


def test_files_from_env__errors_name_flag_and_variable() -> None:
    with pytest.raises(
        TLSError, match=r"-client-cert \(or DROVER_CLIENT_CERT\) was given without -client-key"
    ):
        files_from_env({"DROVER_CACERT": "ca.pem", "DROVER_CLIENT_CERT": "c.pem"}, None, None, None)


# --- loading: each file is read and checked once --------------------------------------------


def test_load__good_files__bytes_and_server_name(tmp_path: Path) -> None:
    ca_file, _ = _write(tmp_path, "ca", CA)
    cert, key = _write(tmp_path, "cli", certs.create_cert(CA, "cli"))
    material = TLSFiles(ca_file, cert, key).load()
    assert material.ca == CA.cert
    assert material.cert == Path(cert).read_bytes() and material.key == Path(key).read_bytes()
    assert material.server_name == SERVER_NAME == "server.global.drover"


def test_load__missing_file__names_flag_and_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(TLSError, match=r"^-ca-cert \(or DROVER_CACERT\) .*nope.pem: No such file"):
        TLSFiles(missing, names=CLI_FLAGS).load()


def test_load__not_pem__refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(TLSError, match=r"ca_file .*junk\.pem: not a PEM certificate"):
        TLSFiles(str(junk)).load()


def test_load__key_of_another_certificate__refused(tmp_path: Path) -> None:
    ca_file, _ = _write(tmp_path, "ca", CA)
    cert, _ = _write(tmp_path, "a", certs.create_cert(CA, "cli"))
    _, other_key = _write(tmp_path, "b", certs.create_cert(CA, "cli"))
    with pytest.raises(TLSError, match="is not the key of the certificate"):
        TLSFiles(ca_file, cert, other_key).load()


def test_load__expired_certificate__refused(tmp_path: Path) -> None:
    ca_file, _ = _write(tmp_path, "ca", CA)
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    cert, key = _write(tmp_path, "old", certs.create_cert(CA, "cli", days=1, now=past))
    with pytest.raises(TLSError, match="expired on"):
        TLSFiles(ca_file, cert, key).load()


def test_server_credentials__without_identity__refused() -> None:
    with pytest.raises(TLSError, match="needs its own certificate"):
        server_credentials(TLSMaterial(ca=CA.cert, cert=None, key=None), require_client_cert=False)


# --- certificates ---------------------------------------------------------------------------


def test_create_ca__a_ca_that_signs_only_leaves() -> None:
    cert = x509.load_pem_x509_certificate(CA.cert)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign


@pytest.mark.parametrize(
    ("role", "ips"),
    [("server", ["127.0.0.1", "::1"]), ("client", ["127.0.0.1", "::1"]), ("cli", [])],
    ids=["server", "client", "cli"],
)
def test_create_cert__names_by_role(role: certs.Role, ips: list[str]) -> None:
    pair = certs.create_cert(CA, role)
    cert = x509.load_pem_x509_certificate(pair.cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(CA.cert))
    dns, got_ips = _sans(pair)
    assert dns == [f"{role}.global.drover", "localhost"]
    assert got_ips == ips
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_create_cert__additional_names_are_added() -> None:
    pair = certs.create_cert(CA, "cli", dns_names=["ops.example"], ip_addresses=["10.0.0.7"])
    assert _sans(pair) == (["cli.global.drover", "localhost", "ops.example"], ["10.0.0.7"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"ip_addresses": ["nope"]}, "not an IP address"), ({"days": 0}, "days must be >= 1")],
    ids=["bad-ip", "zero-days"],
)
def test_create_cert__bad_request__cert_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(certs.CertError, match=message):
        certs.create_cert(CA, "server", **kwargs)  # type: ignore[arg-type]


def test_create_cert__key_of_another_ca__refused() -> None:
    with pytest.raises(certs.CertError, match="does not belong to the CA certificate"):
        certs.create_cert(certs.PemPair(CA.cert, OTHER_CA.key), "server")


def test_write_pair__key_0600_cert_0644_and_never_overwrites(tmp_path: Path) -> None:
    cert, key = _write(tmp_path, "ca", CA)
    assert stat.S_IMODE(Path(key).stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(cert).stat().st_mode) == 0o644
    with pytest.raises(certs.CertError, match="already exists"):
        certs.write_pair(OTHER_CA, cert, key)
    assert Path(cert).read_bytes() == CA.cert


# --- handshakes: a real gRPC server in this process ----------------------------------------


def _material(ca: certs.PemPair, pair: certs.PemPair | None) -> TLSMaterial:
    return TLSMaterial(ca=ca.cert, cert=pair.cert if pair else None, key=pair.key if pair else None)


@contextmanager
def _health_server(identity: certs.PemPair, *, verify: bool) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(_material(CA, identity), require_client_cert=verify)
    )
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def _check(address: str, tls: TLSMaterial | None) -> grpc.StatusCode:
    with open_channel(address, tls) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


SERVER = certs.create_cert(CA, "server")
CLI = certs.create_cert(CA, "cli")
FOREIGN_CLI = certs.create_cert(OTHER_CA, "cli")


def test_handshake__tls_server__plaintext_refused_ca_accepted() -> None:
    with _health_server(SERVER, verify=False) as address:
        assert _check(address, None) == grpc.StatusCode.UNAVAILABLE
        assert _check(address, _material(CA, None)) == grpc.StatusCode.OK


def test_handshake__verifying_server__only_a_certificate_from_its_ca() -> None:
    with _health_server(SERVER, verify=True) as address:
        assert _check(address, _material(CA, None)) == grpc.StatusCode.UNAVAILABLE
        assert _check(address, _material(CA, FOREIGN_CLI)) == grpc.StatusCode.UNAVAILABLE
        assert _check(address, _material(CA, CLI)) == grpc.StatusCode.OK


def test_handshake__a_client_certificate_cannot_pose_as_a_server() -> None:
    # Same CA, loopback SANs, but not server.global.drover: the caller refuses it.
    with _health_server(certs.create_cert(CA, "client"), verify=False) as address:
        assert _check(address, _material(CA, None)) == grpc.StatusCode.UNAVAILABLE


def test_handshake__server_from_another_ca__refused() -> None:
    with _health_server(SERVER, verify=False) as address:
        assert _check(address, _material(OTHER_CA, None)) == grpc.StatusCode.UNAVAILABLE


# --- the SDK: which TLS failures are retried ------------------------------------------------


@contextmanager
def _plaintext_server() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def _write_ca(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_bytes(CA.cert)
    return str(path)


def test_sdk__tls_to_a_plaintext_server__raised_at_the_first_attempt(tmp_path: Path) -> None:
    with (
        _plaintext_server() as address,
        DroverClient(address, retry_deadline=60, tls=TLSFiles(_write_ca(tmp_path))) as client,
        pytest.raises(DroverError) as err,
    ):
        client.list_jobs()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert "handshake failed" in err.value.message.lower()
    assert "no server answered after" not in err.value.message  # not retried


def test_sdk__plaintext_to_a_tls_server__retried_then_says_it_may_be_tls() -> None:
    with (
        _health_server(SERVER, verify=False) as address,
        DroverClient(address, retry_deadline=0.3) as client,
        pytest.raises(DroverError) as err,
    ):
        client.list_jobs()
    assert err.value.message.startswith(f"no drover server at {address}: socket closed")
    assert "is it serving TLS?" in err.value.message


def test_sdk__missing_ca_file__value_error_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ca_file .*nope\.pem: No such file"):
        DroverClient("127.0.0.1:1", tls=TLSFiles(str(tmp_path / "nope.pem")))
