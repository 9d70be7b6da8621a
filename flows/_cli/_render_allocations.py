"""Print ``unattended inspect --allocations``: the scheduler jobs and the budget's totals."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from flows._cli._render import _narrowed, _table, _when


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _ended(job: dict[str, Any]) -> str:
    if job["ended_at"]:
        return _when(job["ended_at"])
    if job["started_at"] and job["ends_at"]:
        return f"{_when(job['ends_at'])} planned"
    return "-"


def print_allocations(console: Console, view: dict[str, Any], *, wide: bool = False) -> None:
    """Print a campaign's allocations (scheduler jobs), one line each, and the budget's totals."""
    columns = (
        "job",
        "request",
        "state",
        "end reason",
        "requested",
        "started",
        "ended",
        "walltime",
        "nodes",
        "node-hours",
        "tasks",
        "interrupted",
    )
    rows = [
        [
            job["job_id"],
            job["request"],
            job["state"] + (f" ({job['reason']})" if job["reason"] else ""),
            job["end_reason"],
            _when(job["requested_at"]),
            _when(job["started_at"]),
            _ended(job),
            _duration(job["walltime_seconds"]),
            f"{job['node_count']}" + (f" ({', '.join(job['nodes'])})" if job["nodes"] else ""),
            f"{job['node_hours']:.4f}",
            job["tasks"],
            job["interrupted"],
        ]
        for job in view["allocations"]
    ]
    title = f"Allocations of campaign {view['campaign']} (UTC)"
    shown, rows = _narrowed(columns, rows, ("request", "requested"), wide=wide)
    console.print(_table(title, shown, rows, wide=wide))
    t = view["totals"]
    outside = f"; {t['tasks_outside']} task(s) outside any of them" if t["tasks_outside"] else ""
    console.print(
        Text(
            f"Total: {t['requests']} allocation request(s), {t['jobs']} job(s), "
            f"{t['node_hours']:.4f} node-hours charged as of {_when(view['at'])}, "
            f"{t['tasks']} task(s){outside}"
        )
    )
