"""``unattended inspect`` and ``unattended export``: read the provenance offline.

Registering imports nothing heavy; the handlers read a SQLite file with the
standard library (``flows/_provenance/_sqlite.py``: no SQLAlchemy, sqlmodel or
pydantic), ``inspect`` draws with rich, and neither imports Prefect. Databases are opened read-only:
inspecting never creates, changes or migrates a file. Bad input (no database,
a corrupt file, an unknown campaign or round, a newer schema) prints one line
on stderr and exits 2.

Where the database is: ``--db`` takes a URL, a ``.db`` file, a campaign
directory (holding ``provenance.db``) or a state directory (holding
``campaigns/``). Without ``--db`` the state directory is ``$UNATTENDED_HOME``
(default ``~/.unattended``) and campaign ``NAME`` lives in
``<state>/campaigns/NAME/provenance.db``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flows._paths import state_dir_from
from policies import ValidationFailed

_DB_HELP = (
    "database: a postgresql+psycopg:// URL, a .db file, a campaign directory or a state "
    "directory (default: $UNATTENDED_HOME, else ~/.unattended)"
)


def register(subparsers: Any) -> None:
    """Add the ``inspect`` and ``export`` commands to the CLI."""
    inspect = subparsers.add_parser(
        "inspect",
        help="show a campaign's provenance: campaigns, a summary, or one round in full",
        description=(
            "Without CAMPAIGN, list campaigns. With CAMPAIGN, summarise its rounds, "
            "dispositions, acceptance rate, fallbacks, approvals and best result. With "
            "--round N, show that round in full: every gate call and attempt with its "
            "verdicts, the fallback and its hash, policy decisions, approvals, the batch "
            "and its task results, each with the job it ran in and that job's window. With "
            "--allocations, list the scheduler jobs (allocations) the campaign's work ran in: "
            "state and end reason as recorded, times in UTC, walltime, nodes, node-hours "
            "charged and tasks, with the totals the allocation budget counts."
        ),
    )
    inspect.add_argument("campaign", nargs="?", help="campaign name")
    inspect.add_argument("--round", type=int, dest="round_index", metavar="N", help="round index")
    inspect.add_argument(
        "--allocations",
        action="store_true",
        help="list the campaign's allocations (scheduler jobs) and what they used",
    )
    inspect.add_argument("--json", action="store_true", help="print JSON instead of tables")
    inspect.add_argument(
        "--wide",
        action="store_true",
        help="every column, each value in full (by default long values are summarised and "
        "tables fit the terminal, 100 columns when piped)",
    )
    inspect.add_argument("--db", metavar="URL_OR_PATH", help=_DB_HELP)
    inspect.set_defaults(handler=_inspect)

    export = subparsers.add_parser(
        "export",
        help="export a campaign's provenance as JSON lines, CSV, an RO-Crate or W3C PROV",
        description=(
            "jsonl: one JSON object per record, with a 'kind' (campaign, round, decision, "
            "attempt, approval, batch, task_result, allocation). csv: one table per file: "
            "one row per attempt, or per task result with --records task_results, or per "
            "allocation (scheduler job) with --records allocations. ro-crate: a Provenance "
            "Run Crate folder (or a .zip with --out FILE.zip; default ./NAME-ro-crate). "
            "prov: W3C PROV as OUT.prov.json and OUT.provn (default ./NAME)."
        ),
    )
    export.add_argument("campaign", help="campaign name")
    export.add_argument("--format", choices=("jsonl", "csv", "ro-crate", "prov"), required=True)
    export.add_argument(
        "--records",
        choices=("all", "attempts", "task_results", "allocations"),
        help="which records (default: all for jsonl, attempts for csv)",
    )
    export.add_argument(
        "--output",
        "--out",
        metavar="PATH",
        help="write here instead of stdout (ro-crate: a folder or FILE.zip; prov: a file stem)",
    )
    export.add_argument("--db", metavar="URL_OR_PATH", help=_DB_HELP)
    export.set_defaults(handler=_export)


def database_locations(db: str | None, campaign: str | None, env: Mapping[str, str]) -> list[str]:
    """Return the databases to read for ``--db`` and ``campaign`` (see the module doc)."""
    if db is not None and "://" in db:
        return [db]
    if db is not None:
        path = Path(db).expanduser()
        if not (path.is_dir() and (path / "campaigns").is_dir()):
            return [str(path)]
        root = path
    else:
        root = state_dir_from(None, env)
    campaigns = root / "campaigns"
    if campaign is not None:
        database = campaigns / campaign / "provenance.db"
        if not database.exists():
            from policies import NotFound

            raise NotFound(
                f"no campaign named {campaign} in {root} (no {database}); 'unattended inspect' "
                "lists the campaigns there, and --db URL reads one recorded elsewhere "
                "(its site's provenance_url)",
                details={"campaign": campaign, "path": str(database)},
            )
        return [str(database)]
    return [str(p) for p in sorted(campaigns.glob("*/provenance.db"))] or [str(campaigns)]


def _inspect(args: argparse.Namespace) -> int:
    from flows._cli import _records
    from flows._cli import _render as render

    locations = database_locations(args.db, args.campaign, os.environ)
    if args.campaign is None and args.round_index is not None:
        raise ValidationFailed("--round needs a CAMPAIGN", details={"field": "--round"})
    if args.allocations and (args.campaign is None or args.round_index is not None):
        raise ValidationFailed(
            "--allocations needs a CAMPAIGN and no --round", details={"field": "--allocations"}
        )
    if args.campaign is None:
        data: Any = render.list_campaigns(locations)
        render.show(data, render.print_campaigns, as_json=args.json, wide=args.wide)
        return 0
    with _records.open_read_only(locations[0]) as store:
        if args.allocations:
            data = _allocations(store, args.campaign)
            from flows._cli._render_allocations import print_allocations

            render.show(data, print_allocations, as_json=args.json, wide=args.wide)
        elif args.round_index is None:
            data = store.summary(args.campaign)
            render.show(data, render.print_summary, as_json=args.json, wide=args.wide)
        else:
            data = store.round_view(args.campaign, args.round_index)
            render.show(data, render.print_round, as_json=args.json, wide=args.wide)
    return 0


def _allocations(store: Any, campaign: str) -> dict[str, Any]:
    from flows._provenance._allocation_reads import allocation_view
    from flows._provenance._rows import now

    with store.reading() as reader:
        return allocation_view(reader, campaign, now())


def _export(args: argparse.Namespace) -> int:
    from flows._cli import _records

    location = database_locations(args.db, args.campaign, os.environ)[0]
    if args.format in ("ro-crate", "prov"):
        if args.records is not None:
            raise ValidationFailed(
                f"--records applies to jsonl and csv, not --format {args.format}",
                details={"field": "--records"},
            )
        return _records.export_graph(location, args.campaign, fmt=args.format, output=args.output)
    records = args.records or ("all" if args.format == "jsonl" else "attempts")
    if args.format == "csv" and records == "all":
        raise ValidationFailed(
            "--format csv needs --records attempts or task_results", details={"field": "--records"}
        )
    with _records.open_read_only(location) as store:
        _records.export(store, args.campaign, fmt=args.format, records=records, output=args.output)
    return 0
