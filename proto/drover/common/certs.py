"""Making a private CA and the certificates drover's agents, CLI and SDK present (Nomad's
``tls ca create`` / ``tls cert create``), as PEM bytes; writing files is the caller's job.

Names follow Nomad's, with ``drover`` for its ``nomad`` domain: every certificate's common
name, and first DNS name, is ``<role>.<region>.drover`` (``server.global.drover``). drover's
gRPC clients check a server's certificate against :data:`drover.common.tls.SERVER_NAME`,
never against the address they dialled, so a client or CLI certificate from the same CA
cannot pose as a server, and servers need no SAN per host. The loopback SANs on server and
client certificates (``localhost``, ``127.0.0.1``, ``::1``) are for tools that do check the
address (grpcurl, curl); a CLI certificate gets only the addresses asked for, as in Nomad.

Keys are ECDSA P-256; every certificate may be used both to serve and to call (a server
calls the leader when it forwards a write, with its own certificate).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_DAYS",
    "CA_FILE",
    "CA_KEY_FILE",
    "CERT_DAYS",
    "DOMAIN",
    "REGION",
    "ROLES",
    "CertError",
    "PemPair",
    "Role",
    "cert_file_names",
    "common_name",
    "create_ca",
    "create_cert",
    "parse_ip_addresses",
    "read_pair",
    "write_pair",
]

Role = Literal["server", "client", "cli"]
ROLES: Final[tuple[Role, ...]] = ("server", "client", "cli")
DOMAIN: Final = "drover"
# drover has one region; the name keeps Nomad's shape so certificates read the same.
REGION: Final = "global"
CA_FILE: Final = f"{DOMAIN}-agent-ca.pem"
CA_KEY_FILE: Final = f"{DOMAIN}-agent-ca-key.pem"
CA_DAYS: Final = 1825
CERT_DAYS: Final = 365
CA_COMMON_NAME: Final = "Drover Agent CA"
_LOOPBACK_IPS: Final = ("127.0.0.1", "::1")
# A clock a little behind the CA's must still accept a certificate made just now.
_BACKDATE: Final = datetime.timedelta(minutes=5)


class CertError(ValueError):
    """A certificate cannot be made as asked; one line, naming what is wrong."""


@dataclass(frozen=True, slots=True)
class PemPair:
    """A certificate and its private key, PEM-encoded (the key unencrypted: keep it 0600)."""

    cert: bytes
    key: bytes


def common_name(role: Role, region: str = REGION) -> str:
    return f"{role}.{region}.{DOMAIN}"


def cert_file_names(role: Role, region: str = REGION) -> tuple[str, str]:
    """Nomad's file names with drover's domain: ``global-server-drover.pem`` and its
    ``global-server-drover-key.pem``."""
    stem = f"{region}-{role}-{DOMAIN}"
    return f"{stem}.pem", f"{stem}-key.pem"


def parse_ip_addresses(texts: Sequence[str]) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]:
    out = []
    for text in texts:
        try:
            out.append(ipaddress.ip_address(text.strip()))
        except ValueError as exc:
            raise CertError(f"{text!r} is not an IP address") from exc
    return tuple(out)


def create_ca(*, days: int = CA_DAYS, now: datetime.datetime | None = None) -> PemPair:
    """A self-signed CA that may sign only end-entity certificates (path length 0)."""
    _check_days(days)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    start = (now or datetime.datetime.now(datetime.UTC)) - _BACKDATE
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _BACKDATE + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return PemPair(_cert_pem(cert), _key_pem(key))


def create_cert(
    ca: PemPair,
    role: Role,
    *,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    days: int = CERT_DAYS,
    now: datetime.datetime | None = None,
) -> PemPair:
    """A certificate for ``role`` signed by ``ca``, with the SANs described above plus
    ``dns_names`` and ``ip_addresses``."""
    if role not in ROLES:
        raise CertError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    _check_days(days)
    ca_cert, ca_key = _load_ca(ca)
    cn = common_name(role)
    dns = list(dict.fromkeys([cn, "localhost", *(d.strip() for d in dns_names if d.strip())]))
    ips = parse_ip_addresses([*(_LOOPBACK_IPS if role != "cli" else ()), *ip_addresses])
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or datetime.datetime.now(datetime.UTC)) - _BACKDATE
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ip) for ip in dict.fromkeys(ips)]
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _BACKDATE + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return PemPair(_cert_pem(cert), _key_pem(key))


def read_pair(cert_path: str, key_path: str) -> PemPair:
    try:
        with open(cert_path, "rb") as cert, open(key_path, "rb") as key:
            return PemPair(cert.read(), key.read())
    except OSError as exc:
        raise CertError(f"{exc.filename}: {exc.strerror or exc}") from exc


def write_pair(pair: PemPair, cert_path: str, key_path: str) -> None:
    """Write both files, neither over an existing file (Nomad never overwrites either); the
    key is created 0600 (never readable by others, not even for a moment), the cert 0644."""
    for path in (cert_path, key_path):
        if os.path.lexists(path):
            raise CertError(f"{path} already exists: refusing to overwrite it")
    _write_new(key_path, pair.key, 0o600)
    _write_new(cert_path, pair.cert, 0o644)


def _write_new(path: str, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        raise CertError(f"{path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "wb") as fh:
        # The umask may have taken bits away, never added any; set exactly what was asked.
        os.fchmod(fh.fileno(), mode)
        fh.write(data)


def _load_ca(ca: PemPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(ca.cert)
        key = serialization.load_pem_private_key(ca.key, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"the CA certificate or key does not parse: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError("the CA key is not an ECDSA key")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        raise CertError("the CA key does not belong to the CA certificate")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound as exc:
        raise CertError("the CA certificate lacks basic constraints or a key identifier") from exc
    if not constraints.ca:
        raise CertError("the CA certificate is not a CA")
    return cert, key


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _check_days(days: int) -> None:
    if days < 1:
        raise CertError(f"days must be >= 1, got {days}")


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
