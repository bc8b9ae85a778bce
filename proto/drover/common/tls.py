"""TLS for every drover gRPC connection, from PEM files: checked once, used by the server's
port, its forwarding channel, client agents, the SDK and the CLI alike.

The rules, the same everywhere:

- A CA file given means TLS; nothing given means plaintext, on the same ``host:port``.
- A certificate and its key come together, and only with a CA (there is no system trust
  store: a drover cluster trusts its own CA, Nomad's model).
- A server must present a certificate (its cert and key are required with its CA).
- Every client checks the server's certificate against :data:`SERVER_NAME`
  (``server.global.drover``), not against the host it dialled, as Nomad's RPC does with
  ``server.<region>.nomad``: the same certificates work behind any address, and a client or
  CLI certificate from the same CA cannot pose as a server. A certificate from another CA
  never passes.

Files are read and checked here (each parses, the key belongs to the certificate, the
certificate has not expired), so a mistake is one line naming the flag and file at start-up,
not a failed handshake later. Nothing is reloaded: a new certificate takes a restart.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

__all__ = [
    "AGENT_FLAGS",
    "CA_ENV",
    "CERT_ENV",
    "CLI_FLAGS",
    "KEY_ENV",
    "SDK_NAMES",
    "SERVER_NAME",
    "FileNames",
    "TLSError",
    "TLSFiles",
    "TLSMaterial",
    "channel_options",
    "files_from_env",
    "open_channel",
    "server_credentials",
    "tls_files",
]

SERVER_NAME: Final = "server.global.drover"
CA_ENV: Final = "DROVER_CACERT"
CERT_ENV: Final = "DROVER_CLIENT_CERT"
KEY_ENV: Final = "DROVER_CLIENT_KEY"


class TLSError(ValueError):
    """TLS settings that cannot work; one line, naming the flag (or key) and the file."""


@dataclass(frozen=True, slots=True)
class FileNames:
    """What the user called each file, so an error names the flag they typed."""

    ca: str
    cert: str
    key: str


AGENT_FLAGS: Final = FileNames("-tls-ca-file", "-tls-cert-file", "-tls-key-file")
CLI_FLAGS: Final = FileNames(
    f"-ca-cert (or {CA_ENV})", f"-client-cert (or {CERT_ENV})", f"-client-key (or {KEY_ENV})"
)
SDK_NAMES: Final = FileNames("ca_file", "cert_file", "key_file")


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """Paths to PEM files: the CA that signs the peers, and this side's own certificate and
    key (optional for a client unless the server verifies clients)."""

    ca_file: str
    cert_file: str = ""
    key_file: str = ""
    # The name the server's certificate must carry (see the module docstring).
    server_name: str = SERVER_NAME
    names: FileNames = field(default=SDK_NAMES, compare=False)

    def __post_init__(self) -> None:
        n = self.names
        if not self.ca_file:
            raise TLSError(f"{n.ca} is required for TLS (a CA given means TLS)")
        if bool(self.cert_file) != bool(self.key_file):
            given, missing = (n.cert, n.key) if self.cert_file else (n.key, n.cert)
            raise TLSError(f"{given} was given without {missing}: a certificate and its key go together")

    @property
    def has_identity(self) -> bool:
        return bool(self.cert_file)

    def load(self) -> TLSMaterial:
        """Read and check every file; the bytes gRPC needs."""
        n = self.names
        ca = _read(n.ca, self.ca_file)
        try:
            x509.load_pem_x509_certificates(ca)
        except ValueError as exc:
            raise TLSError(f"{n.ca} {self.ca_file}: not a PEM certificate") from exc
        if not self.has_identity:
            return TLSMaterial(ca=ca, cert=None, key=None, server_name=self.server_name)
        cert_pem = _read(n.cert, self.cert_file)
        key_pem = _read(n.key, self.key_file)
        try:
            cert = x509.load_pem_x509_certificates(cert_pem)[0]
        except ValueError as exc:
            raise TLSError(f"{n.cert} {self.cert_file}: not a PEM certificate") from exc
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise TLSError(f"{n.key} {self.key_file}: not an unencrypted PEM private key") from exc
        if _spki(key.public_key()) != _spki(cert.public_key()):
            raise TLSError(
                f"{n.key} {self.key_file} is not the key of the certificate in {n.cert} {self.cert_file}"
            )
        if cert.not_valid_after_utc < datetime.datetime.now(datetime.UTC):
            raise TLSError(f"{n.cert} {self.cert_file}: expired on {cert.not_valid_after_utc:%Y-%m-%d}")
        return TLSMaterial(ca=ca, cert=cert_pem, key=key_pem, server_name=self.server_name)


@dataclass(frozen=True, slots=True)
class TLSMaterial:
    """The checked PEM bytes of a :class:`TLSFiles`."""

    ca: bytes
    cert: bytes | None
    key: bytes | None
    server_name: str = SERVER_NAME

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def tls_files(
    ca_file: str | None, cert_file: str | None, key_file: str | None, *, names: FileNames = AGENT_FLAGS
) -> TLSFiles | None:
    """The TLS files given, or None when none is (plaintext); refuses half a setting."""
    ca, cert, key = ca_file or "", cert_file or "", key_file or ""
    if not (ca or cert or key):
        return None
    if not ca:
        given = names.cert if cert else names.key
        raise TLSError(f"{given} was given without {names.ca}: a CA given means TLS, and none was")
    return TLSFiles(ca, cert, key, names=names)


def files_from_env(
    environ: Mapping[str, str], ca_file: str | None, cert_file: str | None, key_file: str | None
) -> TLSFiles | None:
    """The CLI's TLS files: each flag given, else its ``DROVER_*`` environment variable."""
    return tls_files(
        ca_file or environ.get(CA_ENV),
        cert_file or environ.get(CERT_ENV),
        key_file or environ.get(KEY_ENV),
        names=CLI_FLAGS,
    )


def channel_options(tls: TLSMaterial | None) -> tuple[tuple[str, str], ...]:
    """The options that make a channel check :data:`SERVER_NAME` (nothing for plaintext)."""
    return () if tls is None else (("grpc.ssl_target_name_override", tls.server_name),)


def open_channel(
    address: str, tls: TLSMaterial | None, options: Sequence[tuple[str, object]] = ()
) -> grpc.Channel:
    """A channel to ``address``: TLS when ``tls`` is given, plaintext otherwise."""
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, tls.channel_credentials(), options=[*options, *channel_options(tls)])


def server_credentials(tls: TLSMaterial, *, require_client_cert: bool) -> grpc.ServerCredentials:
    """A server port's credentials; with ``require_client_cert`` a peer without a
    certificate from the CA fails the handshake."""
    if tls.cert is None or tls.key is None:
        raise TLSError("a server needs its own certificate and key to serve TLS")
    return grpc.ssl_server_credentials(
        [(tls.key, tls.cert)],
        root_certificates=tls.ca if require_client_cert else None,
        require_client_auth=require_client_cert,
    )


def _read(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise TLSError(f"{name} {path}: {exc.strerror or exc}") from exc


def _spki(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
