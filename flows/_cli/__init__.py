"""The ``unattended`` command line.

Each subcommand lives in its own ``flows._cli._<name>`` module exposing
``register(subparsers)``; registering must stay cheap (no Prefect, no SDK, no
numpy at import) so ``unattended --help`` is fast. Heavy imports happen inside
the handler a subcommand sets with ``parser.set_defaults(handler=...)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from flows._cli._exit import EXIT_BAD_INPUT, closed_pipe, reaches_the_user, report_error

# One module per command group, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "flows._cli._campaign",
    "flows._cli._operate",
    "flows._cli._server",
    "flows._cli._approvers",
    "flows._cli._inspect",
    "flows._cli._report",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="unattended",
        description="Durable, unattended HPC campaigns: gate, policies, approvals, provenance.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (2 for bad input, 1 for a failed run)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        code = int(handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback at exit
    except BrokenPipeError:
        return closed_pipe()
    except Exception as exc:
        if not reaches_the_user(exc):
            raise
        return report_error(exc)
    return code
