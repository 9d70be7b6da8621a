"""``unattended approvers add|remove|list``: each approver's own login to the owner's server.

An approver logs in to the Prefect UI (or points ``PREFECT_API_AUTH_STRING`` at) their
own ``NAME:SECRET``, never the owner's secret: the server then knows who answers
(``flows._prefect._identity``) and lets an approver only read and resume the current
run of a campaign whose rule names them. The secret is shown here once, to the owner,
to hand over privately (not through a shared folder); only its salted scrypt hash is
kept. Registering imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``approvers`` command group to the CLI."""
    parser = subparsers.add_parser(
        "approvers",
        help="make and revoke approvers' own logins to this server",
        description=(
            "Each approver logs in to the server with their own NAME:SECRET: answers are "
            "recorded as who logged in, and an approver may only read and resume the waiting "
            "run of a campaign whose rule names them. Takes effect at once, no restart."
        ),
    )
    actions = parser.add_subparsers(dest="approvers_action", metavar="ACTION")
    add = actions.add_parser("add", help="make NAME's login and show its secret once")
    add.add_argument("name", help="the approver's name, as the policy's approvers list it")
    add.add_argument(
        "--replace", action="store_true", help="issue a new secret; the old one stops working"
    )
    add.set_defaults(handler=_add)
    remove = actions.add_parser("remove", help="revoke NAME's login (at once)")
    remove.add_argument("name")
    remove.set_defaults(handler=_remove)
    listing = actions.add_parser("list", help="list the approvers who can log in")
    listing.set_defaults(handler=_list)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _logins() -> Any:
    from flows._prefect._identity_logins import ApproverLogins, logins_path
    from flows._prefect._server import load_server_config

    return ApproverLogins(logins_path(load_server_config(os.environ).prefect_home))


def _add(args: argparse.Namespace) -> int:
    logins = _logins()
    made = datetime.now(UTC).isoformat(timespec="seconds")
    secret = logins.add(args.name, replace=args.replace, created_at=made)
    print(f"approver {args.name} can log in; only a hash is kept in {logins.path} (0600)")
    print("Give this login to the approver privately, once (it is not shown again):")
    print(f"  {args.name}:{secret}")
    print("They type it at the Prefect UI's login prompt, or set it as PREFECT_API_AUTH_STRING.")
    return 0


def _remove(args: argparse.Namespace) -> int:
    from policies import NotFound

    logins = _logins()
    if not logins.remove(args.name):
        raise NotFound(
            f"approver {args.name!r} has no login ({logins.path})", details={"approver": args.name}
        )
    print(f"approver {args.name}'s login is revoked (at once; the server needs no restart)")
    return 0


def _list(_args: argparse.Namespace) -> int:
    logins = _logins().read()
    if not logins:
        print("no approver can log in yet ('unattended approvers add NAME')")
        return 0
    for login in logins.values():
        print(f"{login.name}\tsince {login.created_at}")
    return 0
