"""Stream a campaign's whole record for ``unattended export``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flows._provenance import _queries as sql
from flows._provenance._readers import (
    allocations,
    approval,
    campaign_row,
    plain,
    require_campaign,
    task_records,
)
from flows._provenance._rows import as_dict
from flows._provenance._sql import Reader


def export_records(reader: Reader, name: str) -> Iterator[dict[str, Any]]:
    """Yield every record of campaign ``name`` as ``{"kind": ..., ...}`` dicts, in order."""
    cid = require_campaign(reader, name)
    yield {"kind": "campaign", **campaign_row(reader, cid)}
    for kind, query in (("round", sql.EXPORT_ROUNDS), ("decision", sql.EXPORT_DECISIONS)):
        for row in reader.all(query, cid=cid):
            yield {"kind": kind, **plain(row)}
    yield from export_attempts(reader, name)
    for key in reader.scalars(sql.EXPORT_APPROVAL_KEYS, cid=cid):
        yield {"kind": "approval", **as_dict(approval(reader, key))}
    for batch in reader.all(sql.EXPORT_BATCHES, cid=cid):
        yield {"kind": "batch", **plain(batch, drop=("id", "campaign_id"))}
        yield from _task_results(reader, batch)
    yield from _allocations(reader, cid)


def export_attempts(reader: Reader, name: str) -> Iterator[dict[str, Any]]:
    """Yield one flat record per attempt of campaign ``name`` (streamed, for big campaigns)."""
    cid = require_campaign(reader, name)
    for row in reader.stream(sql.EXPORT_ATTEMPTS, cid=cid):
        accepted = row["rejected_by"] is None and row["failed_by"] is None
        yield {"kind": "attempt", "accepted": accepted, **plain(row)}


def export_task_results(reader: Reader, name: str) -> Iterator[dict[str, Any]]:
    """Yield one flat record per task result of campaign ``name``, by batch and index."""
    cid = require_campaign(reader, name)
    for batch in reader.all(sql.EXPORT_BATCHES, cid=cid):
        yield from _task_results(reader, batch)


def _task_results(reader: Reader, batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for record in task_records(reader, batch["id"]):
        yield {
            "kind": "task_result",
            "batch": batch["key"],
            "round_index": batch["round_index"],
            **as_dict(record),
        }


def export_allocations(reader: Reader, name: str) -> Iterator[dict[str, Any]]:
    """Yield one record per allocation (scheduler job) of campaign ``name``, as recorded."""
    yield from _allocations(reader, require_campaign(reader, name))


def _allocations(reader: Reader, cid: int) -> Iterator[dict[str, Any]]:
    # The rows as recorded, oldest request first; node-hours charged are
    # ``inspect --allocations``'s (an open job's grow with the time it is asked).
    for row in allocations(reader, cid):
        yield {"kind": "allocation", **row}
