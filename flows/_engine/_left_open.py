"""Jobs a crashed run left open are ended before a new run of the campaign asks for its own.

A run that dies (SIGKILL, a node failure, the OOM killer) never releases its batch
jobs: its allocation rows stay open and the jobs may still hold nodes, with
workers (or a pilot) that only the dead process could use. The next run ends them
first (``tasks.retire_left_open``: cancelled if still live, else as Slurm says)
and records how, so what they cost is charged once and the budget
(``scheduler.max_node_hours``) sees their real end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flows._provenance import ProvenanceStore
from tasks import AllocationRecord, SiteConfig, retire_left_open

log = logging.getLogger("unattended.campaign")


def _epoch(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


def _record(row: Mapping[str, Any]) -> AllocationRecord:
    """Return an allocation row (``ProvenanceStore.allocations``) as the executor's record."""
    requested_at = _epoch(row["requested_at"])
    return AllocationRecord(
        job_id=str(row["job_id"]),
        request=int(row["request"]),
        requested_at=requested_at if requested_at is not None else 0.0,
        state=str(row["state"]),
        reason=row["reason"],
        nodes=tuple(row["nodes"] or ()),
        node_count=int(row["node_count"] or 0),
        started_at=_epoch(row["started_at"]),
        ends_at=_epoch(row["ends_at"]),
    )


async def end_left_open(
    store: ProvenanceStore,
    name: str,
    site: SiteConfig,
    env: Mapping[str, str],
    work_dir: str | None = None,
) -> int:
    """End and record the Slurm jobs earlier runs of ``name`` left open; return how many.

    Jobs still running tasks whose results the campaign directory's task ledger
    (``work_dir/task-results``) awaits are spared: the run waits for those results.
    """
    if site.scheduler.system != "slurm":
        return 0
    left_open = [_record(row) for row in store.allocations(name) if row["end_reason"] is None]
    if not left_open:
        return 0
    try:
        ended = await asyncio.to_thread(retire_left_open, left_open, env=env, campaign_dir=work_dir)
    except OSError as exc:  # no squeue here: they stay open, charged until their planned end
        log.warning("cannot end the jobs an earlier run left open: %s", type(exc).__name__)
        return 0
    store.record_allocations(name, ended)
    return len(ended)
