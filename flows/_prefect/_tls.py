"""The local server's TLS certificate: made once per state directory, pinned by every client.

The server speaks HTTPS with a self-signed certificate made on its first start:
``<state dir>/prefect/tls/server.key`` (the private key, 0600: only the owner's
server can prove it holds it) and ``server.pem`` (the certificate, 0644: what a
client trusts). Every client of the owner (the CLI, the runner, its flow runs, the
project's own REST client) gets ``PREFECT_API_SSL_CERT_FILE=<server.pem>``, which
Prefect's HTTP client, its websockets and ``flows._prefect._rest`` use as the only
trusted CA. A process that takes the port of a dead server does not hold the key:
its TLS handshake fails before the client sends a header, the basic-auth secret
included. No process-wide patching is needed, and nothing depends on Prefect's
version.

The certificate names 127.0.0.1, ``localhost`` and the configured host, and is
valid for ten years: it is regenerated only on demand (``unattended server cert
--renew``, with the server stopped), since every co-approver holds a copy.
The fingerprint and the SPKI hash ``show_certificate`` returns are what a
co-approver compares before trusting a copy, and what a Chromium user passes as
``--ignore-certificate-errors-spki-list``.

``cryptography`` (installed with Prefect) is imported only to make or read a
certificate, never by a client that merely pins one (``ssl`` does that).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from flows._paths import private_dir, write_private_file
from policies import UnattendedError

if TYPE_CHECKING:
    from cryptography import x509

# Ten years: a certificate every co-approver copied must not expire under a campaign.
VALIDITY_DAYS: Final = 3650
CERT_MODE: Final = 0o644
KEY_MODE: Final = 0o600
# Always named, whatever the configured host: where clients on the login node connect.
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost")
# Where the server process finds its key and certificate (set by ``server_env``).
SERVER_CERT_VARIABLE: Final = "UNATTENDED_SERVER_TLS_CERT"
SERVER_KEY_VARIABLE: Final = "UNATTENDED_SERVER_TLS_KEY"


class CertificateError(UnattendedError):
    """The server's certificate or key is missing, unreadable, unsafe or does not fit."""

    code = "internal"


@dataclass(frozen=True)
class CertificatePaths:
    """Where one state directory's server key and certificate live."""

    folder: Path

    @property
    def cert(self) -> Path:
        """Return the certificate (PEM, 0644): what clients pin."""
        return self.folder / "server.pem"

    @property
    def key(self) -> Path:
        """Return the private key (PEM, 0600): the server's alone."""
        return self.folder / "server.key"


@dataclass(frozen=True)
class CertificateInfo:
    """What a person checks of a certificate before trusting a copy of it."""

    path: Path
    sha256: str  # of the DER certificate, colon-separated hex (as browsers and openssl show it)
    spki_sha256: str  # base64 SHA-256 of the public key: Chromium's SPKI list format
    names: tuple[str, ...]
    not_before: datetime.datetime
    not_after: datetime.datetime


def client_context(cert_file: str | os.PathLike[str] | None) -> ssl.SSLContext:
    """Return a verifying TLS context trusting ``cert_file`` only (else the system's CAs)."""
    return ssl.create_default_context(cafile=os.fspath(cert_file) if cert_file else None)


def ensure_certificate(paths: CertificatePaths, host: str) -> CertificateInfo:
    """Return the certificate, making key and certificate on first use; check they fit ``host``.

    Raises:
        CertificateError: The key is readable by others, the files are unreadable or
            do not match, or the certificate does not name ``host`` (renew it).
    """
    if not paths.key.exists() and not paths.cert.exists():
        return make_certificate(paths, host)
    if not paths.key.exists() or not paths.cert.exists():
        missing = paths.key if not paths.key.exists() else paths.cert
        raise CertificateError(
            f"the server's TLS {'key' if missing == paths.key else 'certificate'} {missing} "
            "is missing while its pair exists; make a new pair with 'unattended server cert "
            "--renew' (and hand the new certificate to your co-approvers)",
            details={"path": str(missing)},
        )
    mode = paths.key.stat().st_mode & 0o777
    if mode & 0o077:
        raise CertificateError(
            f"the server's TLS key {paths.key} is readable by others (mode {mode:o}): "
            f"run 'chmod 600 {paths.key}', then 'unattended server cert --renew' since "
            "someone may have copied it",
            details={"path": str(paths.key), "mode": f"{mode:o}"},
        )
    info = show_certificate(paths.cert)
    if _name_of(host) not in info.names:
        raise CertificateError(
            f"the server's TLS certificate {paths.cert} does not name host {host!r} "
            f"(it names {', '.join(info.names)}); make one that does with 'unattended "
            "server cert --renew' (and hand it to your co-approvers again)",
            details={"path": str(paths.cert), "host": host},
        )
    return info


def make_certificate(paths: CertificatePaths, host: str) -> CertificateInfo:
    """Make a new key (0600) and self-signed certificate (0644) naming ``host``; replace any."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    private_dir(paths.folder)
    key = ec.generate_private_key(ec.SECP256R1())  # a fast handshake: P-256 ECDSA
    names = _names(host)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "unattended"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"unattended server ({names[0]})"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    san = [
        x509.IPAddress(ipaddress.ip_address(name)) if _is_ip(name) else x509.DNSName(name)
        for name in names
    ]
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        # Its own trust anchor (a browser may import it as an authority), and one that
        # could vouch for nothing but these names even if its key were stolen.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.NameConstraints(permitted_subtrees=_subtrees(names), excluded_subtrees=None),
            critical=True,
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private_file(paths.key, key_pem.decode())  # 0600, atomically
    # Written whole, then renamed: a client never reads half a certificate.
    partial = paths.cert.with_suffix(".pem.new")
    partial.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    os.chmod(partial, CERT_MODE)
    partial.replace(paths.cert)
    return show_certificate(paths.cert)


def show_certificate(cert_file: Path) -> CertificateInfo:
    """Return the fingerprints, names and validity of the PEM certificate ``cert_file``.

    Raises:
        CertificateError: The file is missing or is not a PEM certificate.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except FileNotFoundError:
        raise CertificateError(
            f"no TLS certificate at {cert_file}; the first 'unattended server start' makes it",
            details={"path": str(cert_file)},
        ) from None
    except (OSError, ValueError) as exc:
        raise CertificateError(
            f"cannot read the TLS certificate {cert_file}: {type(exc).__name__}",
            details={"path": str(cert_file)},
        ) from None
    der = certificate.public_bytes(serialization.Encoding.DER)
    spki = certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple(str(name.value) for name in san)
    except x509.ExtensionNotFound:
        names = ()
    return CertificateInfo(
        path=cert_file,
        sha256=hashlib.sha256(der).hexdigest().upper(),
        spki_sha256=base64.b64encode(hashlib.sha256(spki).digest()).decode(),
        names=names,
        not_before=certificate.not_valid_before_utc,
        not_after=certificate.not_valid_after_utc,
    )


def colon_hex(digest: str) -> str:
    """Return a hex digest as ``AB:CD:...``, the way browsers and ``openssl x509`` print it."""
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _name_of(host: str) -> str:
    """Return ``host`` as the certificate spells it (an IP address in its canonical form)."""
    return str(ipaddress.ip_address(host)) if _is_ip(host) else host.lower()


def _subtrees(names: tuple[str, ...]) -> list[x509.GeneralName]:
    from cryptography import x509

    return [
        x509.IPAddress(ipaddress.ip_network(name)) if _is_ip(name) else x509.DNSName(name)
        for name in names
    ]


def _names(host: str) -> tuple[str, ...]:
    names = [*LOOPBACK_NAMES]
    if _name_of(host) not in names:
        names.append(_name_of(host))
    return tuple(names)
