"""``unattended server start|stop|status``: the local Prefect server on the login node.

Registering imports nothing heavy; the handlers import ``flows._server``
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
            "UNATTENDED_SERVER_PORT and UNATTENDED_PREFECT_DATABASE_URL set the defaults."
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
        "--timeout", type=float, default=90.0, help="seconds to wait for /health (default 90)"
    )
    start.set_defaults(handler=_start)

    stop = actions.add_parser("stop", help="stop the server (SIGTERM, then SIGKILL)")
    stop.set_defaults(handler=_stop)

    status = actions.add_parser("status", help="print URLs, PID and database; exit 1 if down")
    status.set_defaults(handler=_status)

    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _config(args: argparse.Namespace) -> Any:
    from flows._server import load_server_config

    return load_server_config(
        os.environ,
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        database_url=getattr(args, "database_url", None),
    )


def _start(args: argparse.Namespace) -> int:
    from flows._server import ServerError, flow_run_ui_url, start_server
    from policies import SpecInvalid

    try:
        config = _config(args)
        handle = start_server(config, timeout=args.timeout)
    except SpecInvalid as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    print(f"Prefect server started (pid {handle.pid})")
    print(f"  API:      {handle.api_url}")
    print(f"  UI:       {handle.ui_url}  (a run: {flow_run_ui_url(handle.ui_url, '<id>')})")
    print(f"  database: {handle.database}")
    print(f"  log:      {handle.log_path}")
    print(f"Clients need: export PREFECT_API_URL={handle.api_url}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    from flows._server import stop_server
    from policies import SpecInvalid

    try:
        config = _config(args)
    except SpecInvalid as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if stop_server(config):
        print("Prefect server stopped")
    else:
        print("Prefect server was not running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from flows._server import server_status
    from policies import SpecInvalid

    try:
        config = _config(args)
    except SpecInvalid as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    status = server_status(config)
    if status.handle is None:
        print(f"Prefect server is not running (state dir {config.state_dir})")
        return 1
    handle = status.handle
    print(
        f"Prefect server running (pid {handle.pid})" + ("" if status.healthy else ", NOT healthy")
    )
    print(f"  API:      {handle.api_url}")
    print(f"  UI:       {handle.ui_url}")
    print(f"  database: {handle.database}")
    print(f"  log:      {handle.log_path}")
    return 0 if status.healthy else 1
