"""``unattended submit|run|serve|status|approvals|approve``: campaigns from the login node.

Registering imports nothing heavy. Handlers connect to the Prefect server first
(``flows._connect``), then import Prefect. Exit codes: 0 completed (or done),
1 failed, 2 bad input, 3 blocked, 4 escalated, 5 still waiting for approval.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_CODES = {"completed": 0, "failed": 1, "blocked": 3, "escalated": 4, "awaiting_approval": 5}


def register(subparsers: Any) -> None:
    """Add the campaign commands to the CLI."""
    run = subparsers.add_parser(
        "run",
        help="run a campaign on the embedded default: start what is missing, submit, follow",
        description=(
            "Start the local Prefect server and the runner if they are not running, submit the "
            "campaign, and follow it until it ends, printing how to approve when it waits. "
            "Ctrl-C stops following; the campaign goes on and 'unattended run' follows it again."
        ),
    )
    run.add_argument("spec", help="the campaign's TOML file")
    run.add_argument("--site", help="site config name or path (default: the spec's site)")
    run.add_argument(
        "--no-wait", action="store_true", help="return when the run waits for approval"
    )
    run.set_defaults(handler=_run)

    submit = subparsers.add_parser(
        "submit", help="validate a campaign, register its deployment, start a run, return"
    )
    submit.add_argument("spec", help="the campaign's TOML file")
    submit.add_argument("--site", help="site config name or path (default: the spec's site)")
    submit.add_argument("--follow", action="store_true", help="follow the run until it ends")
    submit.set_defaults(handler=_submit)

    serve = subparsers.add_parser(
        "serve", help="run the login node's runner: execute campaign runs, expire approvals"
    )
    serve.add_argument("--query-seconds", type=float, default=1.0, help="polling interval (s)")
    serve.add_argument("--detach", action="store_true", help="start in the background and return")
    serve.add_argument("--stop", action="store_true", help="stop the background runner")
    serve.set_defaults(handler=_serve)

    status = subparsers.add_parser("status", help="list campaign runs, or show one")
    status.add_argument("run", nargs="?", help="a flow run id")
    status.set_defaults(handler=_status)

    approvals = subparsers.add_parser("approvals", help="list runs waiting for approval")
    approvals.set_defaults(handler=_approvals)

    approve = subparsers.add_parser(
        "approve", help="answer an approval request (the same resume API as the UI's form)"
    )
    approve.add_argument("run", help="the suspended flow run's id")
    approve.add_argument("--as", dest="approver", required=True, help="your name as an approver")
    approve.add_argument("--reject", action="store_true", help="reject instead of approving")
    approve.add_argument("--comment", default="", help="why (kept in the provenance)")
    approve.add_argument("--batch-size", type=int, help="run only the first N candidates")
    approve.set_defaults(handler=_approve)


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _guarded(fn: Any) -> Any:
    """Turn taxonomy errors into a message and an exit code (2 for bad input)."""

    def handler(args: argparse.Namespace) -> int:
        from policies import UnattendedError

        try:
            return int(fn(args))
        except UnattendedError as exc:
            bad_input = exc.code in {
                "spec_invalid",
                "site_invalid",
                "validation_failed",
                "not_found",
            }
            return _fail(exc.message, 2 if bad_input else 1)

    return handler


@_guarded
def _submit(args: argparse.Namespace) -> int:
    from flows._service_cli import follow, print_submitted, submit_now

    submitted = submit_now(args.spec, args.site, start=False)
    print_submitted(submitted)
    if args.follow:
        return follow(submitted.flow_run_id, wait_for_approval=True)
    return 0


@_guarded
def _run(args: argparse.Namespace) -> int:
    from flows._service_cli import ensure_runner, follow, print_submitted, submit_now

    submitted = submit_now(args.spec, args.site, start=True)
    ensure_runner()
    print_submitted(submitted)
    return follow(submitted.flow_run_id, wait_for_approval=not args.no_wait)


@_guarded
def _serve(args: argparse.Namespace) -> int:
    from flows._service_cli import serve_foreground, start_detached_runner, stop_runner

    if args.stop:
        print("runner stopped" if stop_runner() else "no runner was running")
        return 0
    if args.detach:
        pid = start_detached_runner(args.query_seconds)
        print(f"runner started in the background (pid {pid})")
        return 0
    return serve_foreground(args.query_seconds)


@_guarded
def _status(args: argparse.Namespace) -> int:
    from flows._service_cli import show_run, show_runs

    return show_run(args.run) if args.run else show_runs()


@_guarded
def _approvals(args: argparse.Namespace) -> int:
    from flows._service_cli import show_approvals

    return show_approvals()


@_guarded
def _approve(args: argparse.Namespace) -> int:
    from flows._service_cli import answer

    return answer(
        args.run,
        args.approver,
        reject=args.reject,
        comment=args.comment,
        batch_size=args.batch_size,
    )
