"""``unattended check|submit|run|serve|status|approvals|approve``: campaigns from the login node.

Registering imports nothing heavy. Handlers connect to the Prefect server first
(``flows._prefect._connect``), then import Prefect. Exit codes: 0 completed (or done),
1 failed, 2 bad input, 3 blocked, 4 escalated, 5 still waiting for approval, 6 an
approval answer the flow refused (``approve``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from policies import SpecInvalid

_JSON_HELP = "print one JSON document on stdout instead of text (errors stay on stderr)"


def register(subparsers: Any) -> None:
    """Add the campaign commands to the CLI."""
    check = subparsers.add_parser(
        "check",
        help="check a campaign as submit would (spec, files, site, simulation), no server needed",
        description=(
            "Check everything 'submit' and 'run' check, without a server: the spec, the "
            "transcript and policy it names (every rule that asks for approval names who may "
            "give it), the site config (no <PLACEHOLDER> left, its backend's package "
            "installed), the simulation's program and the first fallback batch. Relative paths "
            "resolve against the spec's folder. Prints every problem found (file and field) "
            "and exits 2, or exits 0."
        ),
    )
    _spec_and_site(check)
    check.add_argument(
        "--json",
        action="store_true",
        help='print one JSON document: {"ok": true, ...} or {"ok": false, "errors": [...]}',
    )
    check.add_argument(
        "--run-simulation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=(
            "run the simulation once on the first fallback candidate (refused: bad_output, "
            "task_failed); default: the UNATTENDED_CHECK_SIMULATION setting (auto: when the "
            "site runs tasks here and one is cheap by its cost model)"
        ),
    )
    check.set_defaults(handler=_check)

    run = subparsers.add_parser(
        "run",
        help="run a campaign on the embedded default: start what is missing, submit, follow",
        description=(
            "Start the local Prefect server and the runner if they are not running, submit the "
            "campaign, and follow it until it ends, printing how to approve when it waits. "
            "Ctrl-C stops following; the campaign goes on and 'unattended run' follows it again. "
            "A campaign is its name: running a completed one again runs nothing and shows its "
            "stored record; to start afresh, give the spec a new name."
        ),
    )
    _spec_and_site(run)
    run.add_argument(
        "--no-wait", action="store_true", help="return when the run waits for approval"
    )
    run.add_argument(
        "--accept-changes",
        action="store_true",
        help="accept inputs that differ from the pinned ones (recorded as a new input revision)",
    )
    run.set_defaults(handler=_run)

    submit = subparsers.add_parser(
        "submit", help="validate a campaign, register its deployment, start a run, return"
    )
    _spec_and_site(submit)
    submit.add_argument("--follow", action="store_true", help="follow the run until it ends")
    submit.add_argument(
        "--accept-changes",
        action="store_true",
        help="accept inputs that differ from the pinned ones (recorded as a new input revision)",
    )
    submit.set_defaults(handler=_submit)

    extend = subparsers.add_parser(
        "extend",
        help="give a campaign more rounds or a larger budget, recorded as a revision",
        description=(
            "Raise campaign NAME's rounds and/or node-hour budget: its spec file (the one it "
            "was submitted with) gets the new values, and it is submitted again. The "
            "submission records a new revision of the campaign's inputs and a "
            "'campaign_extended' event (who, when, old and new values); the run does only "
            "the rounds added. Editing the spec by hand and submitting it does the same. "
            "Only these two fields may grow; any other change is another campaign, refused "
            "naming each field."
        ),
    )
    extend.add_argument("campaign", metavar="NAME", help="the campaign's name")
    extend.add_argument("--rounds", type=int, metavar="N", help="the new number of rounds")
    extend.add_argument(
        "--budget-node-hours", type=float, metavar="H", help="the new node-hour budget"
    )
    extend.add_argument("--follow", action="store_true", help="follow the run until it ends")
    extend.set_defaults(handler=_extend)

    serve = subparsers.add_parser(
        "serve", help="run the login node's runner: execute campaign runs, expire approvals"
    )
    serve.add_argument("--query-seconds", type=float, default=1.0, help="polling interval (s)")
    serve.add_argument(
        "--detach",
        action="store_true",
        help="start in the background and return; does nothing if a runner already serves "
        "(safe from cron or scrontab)",
    )
    serve.add_argument("--stop", action="store_true", help="stop the background runner")
    serve.set_defaults(handler=_serve)

    status = subparsers.add_parser("status", help="list campaign runs, or show one")
    status.add_argument("run", nargs="?", help="a flow run id, or a campaign name (its newest run)")
    status.add_argument("--json", action="store_true", help=_JSON_HELP)
    status.set_defaults(handler=_status)

    approvals = subparsers.add_parser("approvals", help="list runs waiting for approval")
    approvals.add_argument("--json", action="store_true", help=_JSON_HELP)
    approvals.set_defaults(handler=_approvals)

    approve = subparsers.add_parser(
        "approve", help="answer an approval request (the same resume API as the UI's form)"
    )
    approve.add_argument(
        "run", help="the suspended flow run's id, or a campaign name (its newest run)"
    )
    approve.add_argument("--as", dest="approver", required=True, help="your name as an approver")
    approve.add_argument("--reject", action="store_true", help="reject instead of approving")
    approve.add_argument("--comment", default="", help="why (kept in the provenance)")
    approve.add_argument("--batch-size", type=int, help="run only the first N candidates")
    approve.add_argument(
        "--candidates",
        type=_indices,
        metavar="I,J,...",
        help=(
            "run only these candidates (e.g. 0,2,5), by their # in the form's Proposed batch "
            "table: the batch after candidate rules removed what they refuse"
        ),
    )
    approve.add_argument(
        "--code",
        nargs="?",
        const="-",
        help="your one-time code, for rules that require proof; without a value it is "
        "prompted for (not shown, not in the process list)",
    )
    approve.add_argument(
        "--wait",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the flow's verdict on the answer (default 120)",
    )
    approve.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the server took the answer, without the flow's verdict",
    )
    approve.set_defaults(handler=_approve)


def _spec_and_site(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the campaign's TOML file")
    parser.add_argument("--site", help="site config name or path (default: the spec's site)")


def _check(args: argparse.Namespace) -> int:
    import os

    from flows._check import check_campaign
    from flows._cli._exit import ProblemsFoundError
    from flows._words import count

    if args.json:
        return _check_json(args)
    report = check_campaign(args.spec, args.site, os.environ, run_simulation=args.run_simulation)
    if report.checked is None:
        raise ProblemsFoundError(
            [problem.text for problem in report.problems],
            code="site_invalid" if report.site_only else "spec_invalid",
        )
    checked = report.checked
    spec = checked.loaded.spec
    rules = count(checked.rules, "policy rule") if checked.rules else "no policy rules (allowed)"
    print(
        f"ok: campaign {spec.name}: {count(spec.rounds, 'round')} of {spec.batch_size} on "
        f"site {checked.site.name}, {rules}; the simulation and the first fallback batch check out"
    )
    if checked.extension:
        from flows._engine._extension import describe_extension

        print(
            f"  extends the recorded campaign: {describe_extension(checked.extension)} "
            "(submitting it records a new revision)"
        )
    return 0


def _check_json(args: argparse.Namespace) -> int:
    """``check --json``: the verdict as one JSON document, the exit status as without it."""
    import os

    from flows._check import check_campaign
    from flows._cli._exit import EXIT_BAD_INPUT, exit_code_for
    from flows._cli._runs import print_json
    from policies import UnattendedError

    try:
        report = check_campaign(
            args.spec, args.site, os.environ, run_simulation=args.run_simulation
        )
    except UnattendedError as exc:  # what check could not even look at: one error, still JSON
        details = exc.details or {}
        print_json(
            {
                "ok": False,
                "code": exc.code,
                "errors": [
                    {
                        "file": details.get("file"),
                        "field": details.get("field"),
                        "message": exc.message,
                    }
                ],
            }
        )
        return exit_code_for(exc)
    if report.checked is None:
        print_json(
            {
                "ok": False,
                "code": "site_invalid" if report.site_only else "spec_invalid",
                "errors": [
                    {"file": p.file, "field": p.field, "message": p.text} for p in report.problems
                ],
            }
        )
        return EXIT_BAD_INPUT
    checked = report.checked
    spec = checked.loaded.spec
    print_json(
        {
            "ok": True,
            "campaign": spec.name,
            "spec": str(checked.loaded.path),
            "rounds": spec.rounds,
            "batch_size": spec.batch_size,
            "site": checked.site.name,
            "policy_rules": checked.rules,
        }
    )
    return 0


def _submit(args: argparse.Namespace) -> int:
    from flows._cli._submit import follow, print_submitted, submit_now

    submitted = submit_now(args.spec, args.site, start=False, accept_changes=args.accept_changes)
    print_submitted(submitted)
    if args.follow:
        return follow(submitted.flow_run_id, wait_for_approval=True)
    return 0


def _run(args: argparse.Namespace) -> int:
    from flows._cli._runner import ensure_runner
    from flows._cli._submit import follow, print_submitted, show_stored_completion, submit_now

    if show_stored_completion(args.spec, args.site):
        return 0
    submitted = submit_now(args.spec, args.site, start=True, accept_changes=args.accept_changes)
    ensure_runner()
    print_submitted(submitted)
    return follow(submitted.flow_run_id, wait_for_approval=not args.no_wait)


def _extend(args: argparse.Namespace) -> int:
    from flows._cli._resolve import registration_of
    from flows._cli._submit import follow, print_submitted, submit_now
    from flows._engine._extension import raised_text
    from flows._spec import load_campaign

    wanted: dict[str, int | float] = {}
    if args.rounds is not None:
        wanted["rounds"] = args.rounds
    if args.budget_node_hours is not None:
        wanted["budget_node_hours"] = args.budget_node_hours
    if not wanted:
        raise SpecInvalid(
            "give --rounds, --budget-node-hours or both: what grows", details={"field": "--rounds"}
        )
    registration = registration_of(args.campaign)
    path = Path(registration.spec_path)
    spec = load_campaign(path, named_files=False).spec
    for field, value in wanted.items():
        now = getattr(spec, field)
        if not value > now:
            raise SpecInvalid(
                f"campaign {spec.name}: --{field.replace('_', '-')} {value:g} does not grow "
                f"{field} (now {now:g}); an extension only raises it",
                details={"field": field, "campaign": spec.name},
            )
    text = path.read_text(encoding="utf-8")
    edited = raised_text(text, wanted)
    grown = ", ".join(f"{field} {getattr(spec, field):g} -> {v:g}" for field, v in wanted.items())
    _replace_text(path, edited)
    try:
        submitted = submit_now(str(path), registration.site, start=False)
    except BaseException:
        _replace_text(path, text)  # refused or not submitted: the file says what is recorded
        raise
    print(f"campaign {spec.name} extended: {grown} ({path} updated; recorded as a revision)")
    print_submitted(submitted)
    if args.follow:
        return follow(submitted.flow_run_id, wait_for_approval=True)
    return 0


def _replace_text(path: Path, text: str) -> None:
    """Write ``text`` over ``path`` at once (a reader sees the old or the new file)."""
    import os

    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.chmod(path.stat().st_mode & 0o7777)
    os.replace(partial, path)


def _serve(args: argparse.Namespace) -> int:
    from flows._cli._runner import serve_foreground, start_detached_runner, stop_runner

    if args.stop:
        print("runner stopped" if stop_runner() else "no runner was running")
        return 0
    if args.detach:
        from flows._cli._runner import runner_pid

        serving = runner_pid()
        if serving is not None:
            print(f"a runner already serves this state directory (pid {serving}); nothing started")
            return 0
        pid = start_detached_runner(args.query_seconds)
        print(f"runner started in the background (pid {pid})")
        return 0
    return serve_foreground(args.query_seconds)


def _status(args: argparse.Namespace) -> int:
    from flows._cli._resolve import run_of
    from flows._cli._runs import show_run, show_runs

    if not args.run:
        return show_runs(as_json=args.json)
    return show_run(run_of(args.run), as_json=args.json)


def _approvals(args: argparse.Namespace) -> int:
    from flows._cli._runs import show_approvals

    return show_approvals(as_json=args.json)


def _approve(args: argparse.Namespace) -> int:
    from flows._cli._answer import answer
    from flows._cli._resolve import run_of

    if args.batch_size is not None and args.candidates is not None:
        # Which one was meant? The flow would refuse the answer; say so before sending it.
        raise SpecInvalid(
            "give --batch-size or --candidates, not both: the first N candidates, or the "
            "ones named",
            details={"field": "--candidates"},
        )
    return answer(
        run_of(args.run),
        args.approver,
        reject=args.reject,
        comment=args.comment,
        batch_size=args.batch_size,
        wait_seconds=None if args.no_wait else args.wait,
        code=_code(args.code),
        candidates=args.candidates,
    )


def _indices(text: str) -> list[int]:
    """Parse ``--candidates``: distinct non-negative indices, comma-separated."""
    try:
        chosen = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("give indices separated by commas, e.g. 0,2,5") from None
    if any(i < 0 for i in chosen):
        raise argparse.ArgumentTypeError("indices start at 0")
    if len(set(chosen)) != len(chosen):
        raise argparse.ArgumentTypeError("each index once")
    return chosen


def _code(given: str | None) -> str | None:
    if given != "-":
        return given
    import getpass

    return getpass.getpass("one-time code: ")
