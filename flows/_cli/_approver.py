"""``unattended approver add NAME``: enrol an approver's one-time code (RFC 6238 TOTP).

The secret goes to ``<state dir>/approvers/NAME.totp`` (0600) and is shown once,
as an ``otpauth://`` URI (and its base32 secret) for the approver's authenticator
app. Run it as the campaign's owner, on the login node that runs the campaigns:
the flow reads the secret from there. Registering imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import parse_qs, urlsplit


def register(subparsers: Any) -> None:
    """Add the ``approver`` command group to the CLI."""
    parser = subparsers.add_parser(
        "approver",
        help="enrol approvers' one-time codes (for rules with require_proof = true)",
        description=(
            "Enrol an approver's one-time code: a rule with require_proof = true counts an "
            "answer only with the approver's current 6-digit code."
        ),
    )
    actions = parser.add_subparsers(dest="approver_action", metavar="ACTION")
    add = actions.add_parser("add", help="create NAME's secret and show it once")
    add.add_argument("name", help="the approver's name, as the policy's approvers list it")
    add.add_argument(
        "--replace", action="store_true", help="issue a new secret; the old one stops working"
    )
    add.set_defaults(handler=_add)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _add(args: argparse.Namespace) -> int:
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
