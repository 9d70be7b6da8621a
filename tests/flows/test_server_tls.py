"""The server speaks TLS with its state directory's own certificate, and clients pin it.

Unit tests of ``flows._prefect._tls`` on temporary folders, then the session's real
server: HTTPS only, trusted through the certificate alone (not the system's CAs), the
URLs and the UI's API URL ``https://``, and ``unattended server cert``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import stat
import threading
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from flows._cli import main
from flows._prefect._rest import request
from flows._prefect._server import (
    ServerConfig,
    ServerError,
    ServerHandle,
    client_env,
    running_server,
)
from flows._prefect._server_env import server_env
from flows._prefect._tls import (
    CertificateError,
    CertificatePaths,
    colon_hex,
    ensure_certificate,
    make_certificate,
    show_certificate,
)

pytestmark = pytest.mark.timeout(120, func_only=True)


def _cli_env(monkeypatch: pytest.MonkeyPatch, config: ServerConfig) -> None:
    monkeypatch.setenv("UNATTENDED_HOME", str(config.state_dir))
    monkeypatch.setenv("UNATTENDED_SERVER_PORT", str(config.port))


@pytest.fixture
def owner_shell(prefect_server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> ServerConfig:
    """Point the CLI at the session's server, as its owner's shell is; return its config."""
    port = urlsplit(prefect_server.api_url).port
    assert port is not None
    config = ServerConfig(state_dir=prefect_server.prefect_home.parent, port=port)
    _cli_env(monkeypatch, config)
    return config


class TestTheCertificate:
    def test_first_use_makes_a_private_key_and_a_readable_certificate(self, tmp_path: Path) -> None:
        paths = CertificatePaths(tmp_path / "tls")
        info = ensure_certificate(paths, "127.0.0.1")
        assert stat.S_IMODE(paths.key.stat().st_mode) == 0o600
        assert stat.S_IMODE(paths.cert.stat().st_mode) == 0o644
        assert stat.S_IMODE(paths.folder.stat().st_mode) == 0o700
        assert info.names == ("127.0.0.1", "localhost")
        assert (info.not_after - info.not_before).days >= 3650

    def test_it_names_the_configured_host_too(self, tmp_path: Path) -> None:
        info = make_certificate(CertificatePaths(tmp_path / "tls"), "login1.cluster.example")
        assert info.names == ("127.0.0.1", "localhost", "login1.cluster.example")

    def test_it_is_kept_across_uses_never_regenerated_by_itself(self, tmp_path: Path) -> None:
        paths = CertificatePaths(tmp_path / "tls")
        first = ensure_certificate(paths, "127.0.0.1")
        assert ensure_certificate(paths, "localhost") == first
        assert make_certificate(paths, "127.0.0.1").sha256 != first.sha256

    def test_the_fingerprints_are_the_certificate_and_its_public_key(self, tmp_path: Path) -> None:
        paths = CertificatePaths(tmp_path / "tls")
        info = make_certificate(paths, "127.0.0.1")
        certificate = x509.load_pem_x509_certificate(paths.cert.read_bytes())
        der = ssl.PEM_cert_to_DER_cert(paths.cert.read_text())
        spki = certificate.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        assert info.sha256 == hashlib.sha256(der).hexdigest().upper()
        assert info.spki_sha256 == base64.b64encode(hashlib.sha256(spki).digest()).decode()
        assert colon_hex("ABCD12") == "AB:CD:12"

    def test_a_key_others_can_read_is_refused(self, tmp_path: Path) -> None:
        paths = CertificatePaths(tmp_path / "tls")
        make_certificate(paths, "127.0.0.1")
        os.chmod(paths.key, 0o640)
        with pytest.raises(CertificateError, match=r"readable by others \(mode 640\).*chmod 600"):
            ensure_certificate(paths, "127.0.0.1")

    def test_a_host_the_certificate_does_not_name_is_refused(self, tmp_path: Path) -> None:
        paths = CertificatePaths(tmp_path / "tls")
        make_certificate(paths, "127.0.0.1")
        with pytest.raises(CertificateError, match=r"does not name host '10\.1\.2\.3'.*--renew"):
            ensure_certificate(paths, "10.1.2.3")

    def test_a_lost_key_is_said_not_silently_replaced(self, tmp_path: Path) -> None:
        paths = CertificatePaths(tmp_path / "tls")
        make_certificate(paths, "127.0.0.1")
        paths.key.unlink()
        with pytest.raises(CertificateError, match=r"TLS key .* is missing.*--renew"):
            ensure_certificate(paths, "127.0.0.1")

    def test_a_file_that_is_not_a_certificate_is_named(self, tmp_path: Path) -> None:
        (tmp_path / "bad.pem").write_text("not a certificate\n")
        with pytest.raises(CertificateError, match=r"cannot read the TLS certificate .*bad\.pem"):
            show_certificate(tmp_path / "bad.pem")


def _leaf_signed_by(paths: CertificatePaths, name: str, folder: Path) -> tuple[Path, Path]:
    """Return a key and a certificate for ``name`` signed with the server's key (a stolen key)."""
    import datetime

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    issuer = x509.load_pem_x509_certificate(paths.cert.read_bytes())
    issuer_key = serialization.load_pem_private_key(paths.key.read_bytes(), password=None)
    assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(issuer_key, hashes.SHA256())
    )
    key_file, cert_file = folder / "leaf.key", folder / "leaf.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    return key_file, cert_file


def _handshake(pinned: Path, key_file: Path, cert_file: Path, name: str) -> None:
    """Run one TLS handshake: a server with ``cert_file``, a client pinning ``pinned``."""
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert_file, key_file)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        errors: list[BaseException] = []

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                server_side.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError) as exc:
                errors.append(exc)
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                ssl.create_default_context(cafile=pinned).wrap_socket(raw, server_hostname=name),
            ):
                pass
        finally:
            thread.join(10)


class TestNameConstraint:
    def test_a_certificate_its_key_signs_for_another_name_is_refused(self, tmp_path: Path) -> None:
        paths = CertificatePaths(tmp_path / "tls")
        make_certificate(paths, "127.0.0.1")
        key_file, cert_file = _leaf_signed_by(paths, "bank.example", tmp_path)
        with pytest.raises(ssl.SSLCertVerificationError, match="permitted subtree violation"):
            _handshake(paths.cert, key_file, cert_file, "bank.example")

    def test_one_it_signs_for_its_own_name_would_pass(self, tmp_path: Path) -> None:
        """The control: the refusal above is the constraint, not a malformed chain."""
        paths = CertificatePaths(tmp_path / "tls")
        make_certificate(paths, "127.0.0.1")
        key_file, cert_file = _leaf_signed_by(paths, "localhost", tmp_path)
        _handshake(paths.cert, key_file, cert_file, "localhost")


class TestClientEnvironment:
    def test_the_server_is_given_its_key_and_certificate(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        env = server_env(config, {"UNATTENDED_SERVER_TLS_KEY": "/elsewhere/key"})
        assert env["UNATTENDED_SERVER_TLS_KEY"] == str(config.tls.key)
        assert env["UNATTENDED_SERVER_TLS_CERT"] == str(config.tls.cert)
        assert env["PREFECT_UI_API_URL"] == config.api_url
        assert config.api_url.startswith("https://127.0.0.1:")

    def test_a_pid_file_from_before_tls_means_a_plain_http_server(self, tmp_path: Path) -> None:
        """The upgrade path: a server an older version started is spoken to as it is."""
        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        started = psutil.Process(os.getpid()).create_time()
        config.pid_path.write_text(json.dumps({"pid": os.getpid(), "create_time": started}))
        handle = running_server(config)
        assert handle is not None
        assert handle.api_url.startswith("http://127.0.0.1:")
        assert handle.cert_file is None
        assert "PREFECT_API_SSL_CERT_FILE" not in client_env(handle)

    def test_clients_pin_the_servers_certificate(self, prefect_server: ServerHandle) -> None:
        env = client_env(prefect_server)
        assert env["PREFECT_API_URL"].startswith("https://127.0.0.1:")
        assert env["PREFECT_UI_URL"].startswith("https://127.0.0.1:")
        assert env["PREFECT_API_SSL_CERT_FILE"] == str(
            prefect_server.prefect_home / "tls" / "server.pem"
        )
        assert env["PREFECT_API_TLS_INSECURE_SKIP_VERIFY"] == "false"


@pytest.mark.integration
class TestTheRealServer:
    def test_it_answers_https_to_a_client_that_pins_its_certificate(
        self, prefect_server: ServerHandle
    ) -> None:
        response = httpx.get(
            f"{prefect_server.api_url}/health", timeout=10, verify=prefect_server.verify()
        )
        assert response.status_code == httpx.codes.OK

    def test_a_client_trusting_only_the_systems_cas_is_refused(
        self, prefect_server: ServerHandle
    ) -> None:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{prefect_server.api_url}/health", timeout=10)

    def test_plain_http_gets_no_answer(self, prefect_server: ServerHandle) -> None:
        plain = prefect_server.api_url.replace("https://", "http://", 1)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/health", timeout=10)

    def test_the_ui_calls_its_api_over_https(self, prefect_server: ServerHandle) -> None:
        settings = httpx.get(
            f"{prefect_server.ui_url}/ui-settings", timeout=10, verify=prefect_server.verify()
        ).json()
        assert settings["api_url"] == prefect_server.api_url
        assert settings["api_url"].startswith("https://")

    def test_the_rest_client_refuses_another_certificate_and_says_so(
        self, prefect_server: ServerHandle, tmp_path: Path
    ) -> None:
        other = CertificatePaths(tmp_path / "other")
        make_certificate(other, "127.0.0.1")
        env = client_env(prefect_server) | {"PREFECT_API_SSL_CERT_FILE": str(other.cert)}
        with pytest.raises(ServerError, match=r"did not prove it is the Prefect server") as caught:
            request(env, "GET", "health")
        assert "nothing was sent" in caught.value.message

    def test_the_handshake_is_made_by_the_key_only_the_server_holds(
        self, prefect_server: ServerHandle
    ) -> None:
        port = urlsplit(prefect_server.api_url).port
        context = prefect_server.verify()
        assert isinstance(context, ssl.SSLContext)
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            served = tls.getpeercert(binary_form=True)
        pinned = ssl.PEM_cert_to_DER_cert(
            (prefect_server.prefect_home / "tls/server.pem").read_text()
        )
        assert served == pinned


@pytest.mark.integration
class TestServerCertCommand:
    def test_it_shows_path_fingerprint_and_spki_hash(
        self, owner_shell: ServerConfig, capsys: pytest.CaptureFixture[str]
    ) -> None:
        config = owner_shell
        assert main(["server", "cert"]) == 0
        out = capsys.readouterr().out
        info = show_certificate(config.tls.cert)
        assert f"certificate:  {config.tls.cert}" in out
        assert f"SHA-256:      {colon_hex(info.sha256)}" in out
        assert f"SPKI SHA-256: {info.spki_sha256}" in out

    def test_renewing_under_a_running_server_is_refused(
        self,
        owner_shell: ServerConfig,
        prefect_server: ServerHandle,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        before = show_certificate(owner_shell.tls.cert)
        assert main(["server", "cert", "--renew"]) != 0
        assert f"the server runs (pid {prefect_server.pid})" in capsys.readouterr().err
        assert show_certificate(owner_shell.tls.cert) == before

    def test_renewing_a_stopped_servers_certificate_makes_a_new_key(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        config = ServerConfig(state_dir=tmp_path / "home", port=4399)
        _cli_env(monkeypatch, config)
        assert main(["server", "cert"]) == 0
        first = show_certificate(config.tls.cert)
        assert main(["server", "cert", "--renew"]) == 0
        assert "hand the certificate to every co-approver again" in capsys.readouterr().out
        assert show_certificate(config.tls.cert).sha256 != first.sha256
