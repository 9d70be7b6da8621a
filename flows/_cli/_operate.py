"""``unattended cancel|delete NAME`` and ``unattended up``: stop or remove a campaign; recover.

``cancel`` stops a campaign cleanly and records it (``flows._prefect._endings``).
``delete`` removes a campaign's deployment, flow runs and registration, keeping its
provenance unless ``--purge`` (``flows._prefect._delete``); it asks first.
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

    delete = subparsers.add_parser(
        "delete",
        help="remove a campaign's deployment, flow runs and registration (provenance kept)",
        description=(
            "Remove campaign NAME's Prefect deployment and all its flow runs from the server, "
            "and its registration in this state directory, so the runner no longer serves it. "
            "Its provenance is kept (a 'deleted' event is recorded) and 'inspect' still reads "
            "it; 'submit' of its spec later continues it from that record. With --purge the "
            "provenance is removed too (its rows in one transaction, and the campaign's folder) "
            "and a later 'submit' starts afresh. A campaign with an active run is refused: "
            "'unattended cancel NAME' first. Asks you to type the name unless --yes; without a "
            "terminal and without --yes it refuses (exit 2)."
        ),
    )
    delete.add_argument("campaign", metavar="NAME", help="the campaign's name")
    delete.add_argument(
        "--purge",
        action="store_true",
        help="remove the campaign's provenance too (its record and its folder)",
    )
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(handler=_delete)

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
    from flows._cli._runner import runner_alive
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
        if outcome.runs and outcome.in_flight:
            print(
                "a batch in flight was not finished: tasks that ended keep their results; "
                "'unattended submit' continues the campaign from its last completed round "
                "(the cancelled round runs again, its batch included)"
            )
    elif outcome.status is not None:
        code = f" ({outcome.error_code})" if outcome.error_code else ""
        print(f"campaign {name} had already ended: {outcome.status}{code}; nothing recorded")
    return 0


def _delete(args: argparse.Namespace) -> int:
    import asyncio

    from flows._prefect._connect import connect
    from policies import ValidationFailed

    connect(start=False)
    from flows._prefect._delete import delete_campaign, plan_delete

    plan = asyncio.run(plan_delete(args.campaign, purge=args.purge))
    name = plan.name
    if not args.yes:
        if not sys.stdin.isatty():
            raise ValidationFailed(
                f"not deleting campaign {name}: no terminal to ask for confirmation on; "
                "pass --yes to delete without asking",
                details={"field": "--yes", "campaign": name},
            )
        record = (
            f"and its provenance ({plan.provenance}) and folder"
            if args.purge
            else f"(its provenance in {plan.provenance} is kept)"
            if plan.provenance is not None
            else "(its provenance is not touched)"
        )
        print(
            f"this removes campaign {name}'s deployment {plan.registration.deployment_name}, its "
            f"{len(plan.runs)} flow run(s) and its registration {record}"
        )
        typed = input(f"type the campaign's name ({name}) to delete it: ")
        if typed.strip() != name:
            raise ValidationFailed(
                f"the name typed is not {name!r}; nothing was deleted",
                details={"field": "confirmation", "campaign": name},
            )
    outcome = asyncio.run(delete_campaign(plan, purge=args.purge, actor=getpass.getuser()))
    deployment = (
        f"its deployment {plan.registration.deployment_name}"
        if outcome.deployment_deleted
        else "(its deployment was already gone)"
    )
    print(
        f"deleted campaign {name}: {deployment} and {outcome.runs_deleted} flow run(s) removed "
        "from the Prefect server; its registration removed (the runner no longer serves it)"
    )
    if outcome.rows_purged is not None:
        folder = f" and its folder {outcome.folder_removed}" if outcome.folder_removed else ""
        print(
            f"provenance purged: {outcome.rows_purged} row(s) removed from {plan.provenance}"
            f"{folder}; 'unattended submit' of its spec starts it afresh"
        )
    elif plan.provenance is None:
        print(
            f"provenance not touched: it cannot be found ({plan.provenance_problem}); "
            f"'unattended submit' of its spec continues the campaign from whatever record it has"
        )
    else:
        event = (
            "a 'deleted' event recorded"
            if outcome.event_recorded
            else "nothing recorded: it has no record there"
        )
        print(
            f"provenance kept in {plan.provenance} ({event}); 'unattended inspect {name}' "
            "reads it, and 'unattended submit' of its spec continues it from that record"
        )
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
    from flows._cli._runner import runner_pid, start_detached_runner

    serving = runner_pid()
    if serving is not None:
        say(f"runner already serving (pid {serving})")
        return 0
    # Returns once the runner serves; one that dies or hangs at start raises (exit 1).
    pid = start_detached_runner()
    say(f"runner started in the background (pid {pid})")
    return 0
