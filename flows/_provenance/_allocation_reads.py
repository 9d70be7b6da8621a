"""Read a campaign's allocation story back: ``unattended inspect NAME --allocations``.

One line per scheduler job the campaign's workers ran in, as the ``allocation``
table recorded it (state and end reason as Slurm said them), with the walltime it
was given, the node-hours it is charged and how many task results it carried. The
totals are the budget's own count (:func:`~flows._provenance._readers.allocation_usage`),
so what ``inspect`` shows is what ``max_allocations`` and ``max_node_hours`` were
judged against.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flows._provenance import _queries as sql
from flows._provenance._readers import (
    allocation_usage,
    allocations,
    charged_node_hours,
    require_campaign,
)
from flows._provenance._sql import Reader


def _walltime(row: dict[str, Any]) -> float | None:
    """Return the seconds from the job's start to its planned end (its walltime), if known."""
    start, planned = row["started_at"], row["ends_at"]  # ISO text (see ``allocations``)
    if start is None or planned is None:
        return None
    seconds = (datetime.fromisoformat(planned) - datetime.fromisoformat(start)).total_seconds()
    return max(0.0, seconds)


def allocation_view(reader: Reader, name: str, at: datetime) -> dict[str, Any]:
    """Return campaign ``name``'s allocations with node-hours and task counts, and totals.

    Node-hours are charged up to ``at`` (a job a crashed run left open counts until
    its planned end or ``at``, whichever is earlier), as the budget counts them.
    """
    cid = require_campaign(reader, name)
    per_job = {row["job_id"]: row for row in reader.all(sql.ALLOCATION_TASKS, cid=cid)}
    jobs = []
    for row in allocations(reader, cid):
        counted = per_job.pop(row["job_id"], None) or {}
        jobs.append(
            {
                **row,
                "walltime_seconds": _walltime(row),
                "node_hours": charged_node_hours(row, at),
                "tasks": int(counted.get("tasks") or 0),
                "done": int(counted.get("done") or 0),
                "interrupted": int(counted.get("interrupted") or 0),
            }
        )
    usage = allocation_usage(reader, cid, at)
    return {
        "campaign": name,
        "at": at.isoformat(),
        "allocations": jobs,
        "totals": {
            "requests": usage.requests,
            "jobs": len(jobs),
            "node_hours": usage.node_hours,
            "tasks": sum(job["tasks"] for job in jobs),
            # Results recorded without a job (no batch jobs on the site) or under a
            # job the campaign has no row for.
            "tasks_outside": sum(int(row["tasks"] or 0) for row in per_job.values()),
        },
    }
