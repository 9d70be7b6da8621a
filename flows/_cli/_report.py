"""``unattended report`` and ``unattended replay``: read a finished campaign offline.

Registering imports nothing heavy; the handlers import the provenance store,
``flows._report`` (matplotlib, lazily) and ``flows._replay``. Databases are opened
read-only and resolved as ``unattended inspect`` resolves them (``--db`` takes a
URL, a ``.db`` file, a campaign directory or a state directory). Bad input (no
database, an unknown campaign, an invalid policy file) prints one line on stderr,
exits 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from flows._cli._inspect import _DB_HELP, database_locations

if TYPE_CHECKING:
    from flows._replay import ReplayResult


def register(subparsers: Any) -> None:
    """Add the ``report`` and ``replay`` commands to the CLI."""
    report = subparsers.add_parser(
        "report",
        help="write a campaign's HTML report (figures embedded) from its provenance",
        description=(
            "Write report.html and its PNG figures: best result per round, acceptance rate "
            "and dispositions per round, reasons for rejection, approvals (who answered, "
            "when, which candidates), and simulation time per batch. Reads the provenance "
            "database only."
        ),
    )
    report.add_argument("campaign", help="campaign name")
    report.add_argument("--db", metavar="URL_OR_PATH", help=_DB_HELP)
    report.add_argument(
        "--output", metavar="DIR", help="folder to write into (default: ./<campaign>-report)"
    )
    report.set_defaults(handler=_report)

    replay = subparsers.add_parser(
        "replay",
        help="judge a finished campaign's recorded rounds again with a changed policy",
        description=(
            "Rebuild every recorded gate call's round context from the provenance and "
            "evaluate NEW.toml on it, running nothing. Prints recorded against new outcome "
            "per round, the rules that fired, and where they differ; rounds after a new "
            "stop are 'not reached'."
        ),
    )
    replay.add_argument("campaign", help="campaign name")
    replay.add_argument("--policy", required=True, metavar="NEW.toml", help="the policy file")
    replay.add_argument("--db", metavar="URL_OR_PATH", help=_DB_HELP)
    replay.add_argument(
        "--node-hours-per-simulation",
        type=float,
        metavar="H",
        help="cost of one simulation (default: derived from the recorded budget counters, "
        "else the campaign's site config)",
    )
    replay.add_argument(
        "--cannot-suspend",
        action="store_true",
        help="judge as a run that cannot pause for approval (ASK escalates); "
        "default: inferred from the record",
    )
    replay.add_argument("--json", action="store_true", help="print JSON instead of text")
    replay.set_defaults(handler=_replay)


def _report(args: argparse.Namespace) -> int:
    from flows._provenance import ProvenanceStore
    from flows._report import write_report

    location = database_locations(args.db, args.campaign, os.environ)[0]
    output = args.output or f"{args.campaign}-report"
    with ProvenanceStore.open(location, read_only=True) as store:
        path = write_report(store, args.campaign, output)
    print(os.path.abspath(path))
    return 0


def _site_node_hours(site: str) -> float | None:
    """Return the cost per simulation from the site config the campaign named, if it loads."""
    from policies import UnattendedError
    from tasks import load_site

    try:
        return float(load_site(site, env=os.environ).cost.node_hours_per_simulation)
    except UnattendedError:
        return None


def _replay(args: argparse.Namespace) -> int:
    from flows._provenance import ProvenanceStore
    from flows._replay import replay
    from policies import ValidationFailed, load_policy

    if args.node_hours_per_simulation is not None and not args.node_hours_per_simulation >= 0:
        raise ValidationFailed(
            "--node-hours-per-simulation must be a number >= 0",
            details={"field": "--node-hours-per-simulation"},
        )
    policy = load_policy(args.policy)
    location = database_locations(args.db, args.campaign, os.environ)[0]
    with ProvenanceStore.open(location, read_only=True) as store:
        result = replay(
            store,
            args.campaign,
            policy,
            node_hours_per_simulation=args.node_hours_per_simulation,
            can_suspend=False if args.cannot_suspend else None,
            site_node_hours=_site_node_hours,
        )
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_replay(result, policy_file=args.policy))
    return 0


def _rules(rules: tuple[str, ...]) -> str:
    return ", ".join(rules) or "-"


def format_replay(result: ReplayResult, *, policy_file: str) -> str:
    """Return the replay as text: assumptions, one line per gate call, then the differences."""
    lines = [
        f"Replay of campaign {result.campaign} (recorded: {result.recorded_status}) "
        f"with policy {result.policy} ({policy_file})",
        f"node-hours per simulation: {result.node_hours_per_simulation:g} "
        f"({result.node_hours_source}); walltime left: unknown (not recorded); "
        f"can suspend for approval: {'yes' if result.can_suspend else 'no'}",
        "",
    ]
    header = ("round", "call", "gate", "recorded", "recorded rules", "new", "new rules", "")
    rows = [header] + [
        (
            str(s.round_index),
            "-" if s.call_index is None else str(s.call_index),
            s.disposition or "-",
            s.recorded or "-",
            _rules(s.recorded_rules),
            s.new,
            _rules(s.new_rules),
            ("*  " if s.differs else "   ") + s.note,
        )
        for s in result.steps
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    lines.append("")
    differences = result.differences()
    if not result.steps:
        lines.append("No round is recorded: nothing to replay.")
    elif not any(differences.values()):
        lines.append("No differences: the new policy decides every recorded round as recorded.")
    else:
        lines.append("Differences (* above):")
        labels = {
            "stopped": "would have stopped",
            "asked": "would have asked for approval",
            "retried": "would have refused the proposal (retry)",
            "continued": "would have continued",
            "refused": "would have refused other candidates (the same outcome)",
            "not_reached": "not reached (an earlier round stopped the campaign)",
        }
        for key, label in labels.items():
            if differences[key]:
                rounds = ", ".join(str(i) for i in differences[key])
                lines.append(f"  {label}: round{'s' if len(differences[key]) > 1 else ''} {rounds}")
    end = result.new_status + (f" ({result.new_error_code})" if result.new_error_code else "")
    where = "" if result.stopped_round is None else f" in round {result.stopped_round}"
    lines.append(f"Recorded outcome: {result.recorded_status}; with the new policy: {end}{where}.")
    diverged = result.diverged_from
    if diverged is not None and (result.stopped_round is None or result.stopped_round > diverged):
        lines.append(
            f"From round {diverged} on the new policy would have run a different "
            "batch than the record (or needed an answer the record lacks); later rounds are "
            "judged on the recorded batches."
        )
    return "\n".join(lines) + "\n"
