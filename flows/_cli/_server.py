"""``unattended server start|stop|status|cert``: the local Prefect server on the login node.

Registering imports nothing heavy; the handlers import ``flows._prefect._server``
(httpx, psutil, pydantic — never Prefect itself, which runs in the child).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``server`` command group to the CLI."""
    parser = subparsers.add_parser(
        "server",
        help="start, stop or inspect the local Prefect server (API + UI)",
        description=(
            "Manage the local Prefect server. State lives under $UNATTENDED_HOME "
            "(default ~/.unattended)/prefect; UNATTENDED_SERVER_HOST, "
            "UNATTENDED_SERVER_PORT, UNATTENDED_PREFECT_DATABASE_URL and UNATTENDED_SERVER_AUTH "
            "set the defaults. The server requires basic authentication unless started with "
            "--no-auth; its secret is <state dir>/prefect/api-auth (0600). It speaks HTTPS with "
            "a certificate of its own, <state dir>/prefect/tls/server.pem, which every client "
            "pins ('server cert' shows it)."
        ),
    )
    actions = parser.add_subparsers(dest="server_action", metavar="ACTION")

    start = actions.add_parser("start", help="start the server in the background")
    start.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    start.add_argument("--port", type=int, help="TCP port of the API and UI (default 4200)")
    start.add_argument(
        "--database-url",
        help="postgresql+asyncpg://user@host:port/db (default: SQLite in the state dir)",
    )
    start.add_argument(
        "--no-auth",
        dest="auth",
        action="store_const",
        const=False,
        help="do not require authentication (only where nobody else can reach the port)",
    )
    start.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for /health (default: UNATTENDED_SERVER_START_SECONDS, 120)",
    )
    start.set_defaults(handler=_start)

    stop = actions.add_parser("stop", help="stop the server (SIGTERM, then SIGKILL)")
    stop.set_defaults(handler=_stop)

    status = actions.add_parser("status", help="print URLs, PID and database; exit 1 if down")
    status.set_defaults(handler=_status)

    cert = actions.add_parser(
        "cert",
        help="show the server's TLS certificate and its fingerprints (for co-approvers)",
        description=(
            "Print the path of the server's certificate, its SHA-256 fingerprint (compare it "
            "with the one a co-approver's browser or copy shows) and the base64 SHA-256 of its "
            "public key (Chromium's --ignore-certificate-errors-spki-list). The certificate is "
            "made on the first 'server start' (or here, if missing) and kept for ten years."
        ),
    )
    cert.add_argument(
        "--renew",
        action="store_true",
        help="make a new key and certificate (the server must be stopped; hand the new "
        "certificate to every co-approver)",
    )
    cert.set_defaults(handler=_cert)

    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _config(args: argparse.Namespace) -> Any:
    from flows._prefect._server import load_server_config

    return load_server_config(
        os.environ,
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        database_url=getattr(args, "database_url", None),
        auth=getattr(args, "auth", None),
    )


def _start(args: argparse.Namespace) -> int:
    from flows._prefect._server import flow_run_ui_url, start_server

    config = _config(args)
    timeout = args.timeout
    if timeout is None:
        from flows._settings import Settings

        timeout = Settings.from_env(os.environ).server_start_seconds
    handle = start_server(config, timeout=timeout)
    print(f"Prefect server started (pid {handle.pid})")
    _print_handle(handle, config)
    print(f"  a run:    {flow_run_ui_url(handle.ui_url, '<id>')}")
    print("unattended commands on this node find the server (and its secret) by themselves.")
    if handle.auth_string is not None:
        print(
            f"The UI asks for the secret once per browser: paste the contents of {config.auth_path}"
        )
    return 0


def _print_handle(handle: Any, config: Any) -> None:
    print(f"  API:      {handle.api_url}")
    print(f"  UI:       {handle.ui_url}")
    print(f"  database: {handle.database}")
    print(f"  log:      {handle.log_path}")
    if handle.cert_file is not None:
        print(f"  TLS:      certificate {handle.cert_file} ('unattended server cert' shows it)")
    else:
        print("  TLS:      NONE (started by an older version): restart the server to turn it on")
    if handle.auth_string is not None:
        print(f"  auth:     basic; secret in {config.auth_path} (0600, never printed)")
    else:
        print("  auth:     NONE: anyone who reaches the port can approve, cancel or delete runs")


def _stop(args: argparse.Namespace) -> int:
    from flows._prefect._server import stop_server

    if stop_server(_config(args)):
        print("Prefect server stopped")
    else:
        print("Prefect server was not running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from flows._prefect._server import server_status

    config = _config(args)
    status = server_status(config)
    if status.handle is None:
        print(f"Prefect server is not running (state dir {config.state_dir})")
        return 1
    handle = status.handle
    print(
        f"Prefect server running (pid {handle.pid})" + ("" if status.healthy else ", NOT healthy")
    )
    _print_handle(handle, config)
    return 0 if status.healthy else 1


def _cert(args: argparse.Namespace) -> int:
    from flows._prefect._server import ServerError, running_server
    from flows._prefect._tls import colon_hex, ensure_certificate, make_certificate

    config = _config(args)
    if args.renew:
        handle = running_server(config)
        if handle is not None:
            raise ServerError(
                f"the server runs (pid {handle.pid}) with the current certificate; stop it "
                "first ('unattended serve --stop', 'unattended server stop'), renew, then start "
                "both again",
                details={"pid": handle.pid},
            )
        info = make_certificate(config.tls, config.host)
        print("made a new key and certificate: hand the certificate to every co-approver again")
    else:
        info = ensure_certificate(config.tls, config.host)
    print(f"certificate:  {info.path}")
    print(f"key:          {config.tls.key} (0600, never copied)")
    print(f"SHA-256:      {colon_hex(info.sha256)}")
    print(f"SPKI SHA-256: {info.spki_sha256}")
    print(f"names:        {', '.join(info.names)}")
    print(f"valid:        {info.not_before:%Y-%m-%d} to {info.not_after:%Y-%m-%d}")
    print(
        "A co-approver copies the certificate over a private channel, checks that its SHA-256 "
        "is the one above, and sets PREFECT_API_SSL_CERT_FILE to the copy; a Chromium user "
        "may instead pass --ignore-certificate-errors-spki-list=<SPKI SHA-256>."
    )
    return 0
