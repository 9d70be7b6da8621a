"""``unattended cancel NAME`` and ``unattended up``: stop a campaign; bring back what is missing.

``cancel`` stops a campaign cleanly and records it (``flows._prefect._cancel``).
``up`` is the one idempotent command for cron or scrontab: it starts the local
Prefect server when none answers, then the runner when none serves this state
directory, and does nothing when both are up (exit 0 in every case).

Registering imports nothing heavy; the handlers connect first and import Prefect after.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``cancel`` and ``up`` to the CLI."""
    cancel = subparsers.add_parser(
        "cancel",
        help="stop a campaign: cancel its active run and record it in the provenance",
        description=(
            "Cancel campaign NAME's active run through Prefect's API (as the UI's Cancel "
            "does) and record the campaign as cancelled in its provenance: 'inspect' shows "
            "it cancelled and the runner never continues it. A batch in flight is not "
            "finished: the tasks that ended keep their results, the others are stopped "
            "with the run's process. Submitting the campaign again continues it from its "
            "last completed round (the cancelled round runs again, its batch included)."
        ),
    )
    cancel.add_argument("campaign", metavar="NAME", help="the campaign's name")
    cancel.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long the runner has to stop a running run before it is ended by force "
        "(default 60)",
    )
    cancel.set_defaults(handler=_cancel)

    up = subparsers.add_parser(
        "up",
        help="start the server if missing, then the runner if missing (for cron; idempotent)",
        description=(
            "Bring back whatever is missing on this login node, in order: the local Prefect "
            "server (unless PREFECT_API_URL names another one), then the background runner. "
            "Does nothing when both are up. Exits 0 in each case, non-zero only when "
            "something could not be started. Meant for a crontab line such as "
            "'*/5 * * * * unattended up >> ~/.unattended/up.log 2>&1'."
        ),
    )
    up.set_defaults(handler=_up)


def _cancel(args: argparse.Namespace) -> int:
    import asyncio

    from flows._prefect._connect import connect

    connect(start=False)
    from flows._cli._service import runner_alive
    from flows._prefect._endings import CANCELLED_CODE, cancel_campaign

    serves = runner_alive()
    outcome = asyncio.run(
        cancel_campaign(
            args.campaign,
            actor=getpass.getuser(),
            wait_seconds=args.wait,
            runner_serves=serves,
        )
    )
    name = outcome.name
    if not outcome.runs:
        print(f"campaign {name} has no active run")
    for run_id in outcome.forced:
        why = (
            "no runner serves this state directory" if not serves else "the runner did not stop it"
        )
        print(
            f"flow run {run_id}: {why} within {args.wait if serves else 0:.0f} s; "
            "set Cancelled by force (a process it left would be fenced out of the campaign)"
        )
    if outcome.recorded:
        print(
            f"campaign {name} cancelled: recorded in its provenance (status blocked, code "
            f"{CANCELLED_CODE}); the runner will not continue it"
        )
        if outcome.runs:
            print(
                "a batch in flight was not finished: tasks that ended keep their results; "
                "'unattended submit' continues the campaign from its last completed round "
                "(the cancelled round runs again, its batch included)"
            )
    elif outcome.status is not None:
        code = f" ({outcome.error_code})" if outcome.error_code else ""
        print(f"campaign {name} had already ended: {outcome.status}{code}; nothing recorded")
    return 0


def _up(args: argparse.Namespace) -> int:
    import os

    from flows._prefect._connect import connect

    started_server: list[str] = []

    def say(message: str) -> None:
        print(message, flush=True)

    def starting(message: str) -> None:
        started_server.append(message)
        say(message)

    external = bool(os.environ.get("PREFECT_API_URL"))
    connect(start=True, announce=starting)
    if started_server:
        say("Prefect server started")
    elif not external:
        say("Prefect server already running")
    from flows._cli._service import runner_alive, runner_pid, start_detached_runner

    serving = runner_pid()
    if serving is not None:
        say(f"runner already serving (pid {serving})")
        return 0
    pid = start_detached_runner()
    if not runner_alive():  # the lock, not its pid file: that is rewritten as it starts
        print(f"error: the runner (pid {pid}) exited at start: see runner.log", file=sys.stderr)
        return 1
    say(f"runner started in the background (pid {pid})")
    return 0
