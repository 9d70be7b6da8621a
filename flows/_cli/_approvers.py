"""``unattended approvers add|remove|list|code``: who may answer, and how they prove it.

``add``, ``remove`` and ``list`` manage each approver's own login to the owner's server.
An approver logs in to the Prefect UI (or points ``PREFECT_API_AUTH_STRING`` at) their
own ``NAME:SECRET``, never the owner's secret: the server then knows who answers
(``flows._prefect._identity``) and lets an approver only read and resume the current
run of a campaign whose rule names them. The secret is shown here once, to the owner,
to hand over privately (not through a shared folder); only its salted scrypt hash is
kept.

``code NAME`` enrols an approver's one-time code (RFC 6238 TOTP) for the rules with
``require_proof = true``: the secret goes to ``<state dir>/approvers/NAME.totp`` (0600)
and is shown once, as an ``otpauth://`` URI (and its base32 secret) for the approver's
authenticator app. Run it as the campaign's owner, on the login node that runs the
campaigns: the flow reads the secret from there. ``approver add NAME``, its first
spelling, still works (a hidden alias).

Registering imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

_NAME_HELP = "the approver's name, as the policy's approvers list it"
_REPLACE_HELP = "issue a new secret; the old one stops working"


def register(subparsers: Any) -> None:
    """Add the ``approvers`` command group (and its old ``approver`` spelling) to the CLI."""
    parser = subparsers.add_parser(
        "approvers",
        help="make and revoke approvers' logins to this server; enrol their one-time codes",
        description=(
            "Each approver logs in to the server with their own NAME:SECRET: answers are "
            "recorded as who logged in, and an approver may only read and resume the waiting "
            "run of a campaign whose rule names them. Takes effect at once, no restart. "
            "'code NAME' enrols NAME's one-time code: a rule with require_proof = true counts "
            "an answer only with the approver's current 6-digit code."
        ),
    )
    actions = parser.add_subparsers(dest="approvers_action", metavar="ACTION")
    add = actions.add_parser("add", help="make NAME's login and show its secret once")
    add.add_argument("name", help=_NAME_HELP)
    add.add_argument("--replace", action="store_true", help=_REPLACE_HELP)
    add.set_defaults(handler=_add)
    remove = actions.add_parser("remove", help="revoke NAME's login (at once)")
    remove.add_argument("name")
    remove.set_defaults(handler=_remove)
    listing = actions.add_parser("list", help="list the approvers who can log in")
    listing.set_defaults(handler=_list)
    _code_parser(actions, "code", "enrol NAME's one-time code; show its secret once")
    parser.set_defaults(handler=lambda _args: _usage(parser))

    # The first spelling, 'approver add NAME': left out of --help (no help=), kept working.
    old = subparsers.add_parser(
        "approver", description="The old spelling of 'unattended approvers code NAME'."
    )
    old_actions = old.add_subparsers(dest="approver_action", metavar="ACTION")
    _code_parser(old_actions, "add", "the old spelling of 'approvers code NAME'")
    old.set_defaults(handler=lambda _args: _usage(old))


def _code_parser(actions: Any, name: str, summary: str) -> None:
    """Add the action that enrols NAME's one-time code, as ``name``."""
    code = actions.add_parser(name, help=summary)
    code.add_argument("name", help=_NAME_HELP)
    code.add_argument("--replace", action="store_true", help=_REPLACE_HELP)
    code.set_defaults(handler=_code)


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


def _code(args: argparse.Namespace) -> int:
    from flows._engine._proof import ApproverCodes
    from flows._paths import approvers_dir, state_dir_from

    codes = ApproverCodes(approvers_dir(state_dir_from(None, os.environ)))
    uri = codes.enroll(args.name, replace=args.replace)
    secret = parse_qs(urlsplit(uri).query)["secret"][0]
    print(f"approver {args.name} enrolled; secret kept in {codes.secret_path(args.name)} (0600)")
    print("Give this to the approver privately, once (it is not shown again):")
    print(f"  {uri}")
    print(f"  (or type the secret into the authenticator app: {secret})")
    print("They answer with: unattended approve RUN --as NAME --code  (prompts for the code)")
    return 0
