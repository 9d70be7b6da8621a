"""``python -m flows._cli._direct SPEC [--site S] [--state-dir DIR]``: a campaign without Prefect.

What the crash suite kills and starts again: the engine in this process
(:func:`flows._engine._direct.run_direct`), one JSON line on stdout, the CLI's
exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from flows._cli._exit import BAD_INPUT_CODES, exit_code_for_status, report_error
from flows._engine._direct import run_direct
from policies import UnattendedError


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the campaign, print one JSON line; return the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m flows._cli._direct", description="Run a campaign without Prefect."
    )
    parser.add_argument("spec", help="the campaign spec (TOML)")
    parser.add_argument("--site", default=None, help="a site name or TOML path")
    parser.add_argument("--state-dir", default=None, help="default: $UNATTENDED_HOME")
    args = parser.parse_args(argv)
    try:
        result = asyncio.run(run_direct(args.spec, site=args.site, state_dir=args.state_dir))
    except UnattendedError as exc:
        if exc.code in BAD_INPUT_CODES:  # bad input: one line, exit 2; anything else a traceback
            return report_error(exc)
        raise
    print(
        json.dumps(
            {
                "status": result.status,
                "error_code": result.error_code,
                "rounds_completed": result.rounds_completed,
                "message": result.message,
            }
        ),
        flush=True,
    )
    return exit_code_for_status(result.status)


if __name__ == "__main__":
    sys.exit(main())
