"""Stream a campaign's whole record for ``unattended export``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, select

from flows._provenance._readers import (
    APPROVALS,
    ATTEMPTS,
    BATCHES,
    CAMPAIGNS,
    DECISIONS,
    GATE_CALLS,
    ROUNDS,
    approval,
    plain,
    require_campaign,
    task_records,
)
from flows._provenance._rows import as_dict


def export_records(connection: Connection, name: str) -> Iterator[dict[str, Any]]:
    """Yield every record of campaign ``name`` as ``{"kind": ..., ...}`` dicts, in order."""
    cid = require_campaign(connection, name)
    yield {
        "kind": "campaign",
        **plain(
            connection.execute(select(CAMPAIGNS).where(CAMPAIGNS.c.id == cid)).one(), drop=("id",)
        ),
    }
    for kind, source in (("round", ROUNDS), ("decision", DECISIONS)):
        for row in connection.execute(
            select(source).where(source.c.campaign_id == cid).order_by(source.c.id)
        ):
            yield {"kind": kind, **plain(row, drop=("id", "campaign_id"))}
    yield from export_attempts(connection, name)
    for key in connection.execute(
        select(APPROVALS.c.key).where(APPROVALS.c.campaign_id == cid).order_by(APPROVALS.c.id)
    ).scalars():
        yield {"kind": "approval", **as_dict(approval(connection, key))}
    for batch in connection.execute(
        select(BATCHES).where(BATCHES.c.campaign_id == cid).order_by(BATCHES.c.id)
    ).all():
        yield {"kind": "batch", **plain(batch, drop=("id", "campaign_id"))}
        for record in task_records(connection, batch.id):
            yield {
                "kind": "task_result",
                "batch": batch.key,
                "round_index": batch.round_index,
                **as_dict(record),
            }


def export_attempts(connection: Connection, name: str) -> Iterator[dict[str, Any]]:
    """Yield one flat record per attempt of campaign ``name`` (streamed, for big campaigns)."""
    cid = require_campaign(connection, name)
    gc, at = GATE_CALLS.c, ATTEMPTS.c
    result = connection.execution_options(yield_per=5000).execute(
        select(
            gc.round_index,
            gc.call_index,
            gc.name.label("gate"),
            gc.disposition,
            gc.fallback_hash,
            at.number,
            at.rejected_by,
            at.reason,
            at.value,
            at.verdicts,
            at.scores,
            at.duration,
            at.trace_id,
            at.span_id,
        )
        .join(GATE_CALLS, gc.id == at.gate_call_id)
        .where(gc.campaign_id == cid)
        .order_by(gc.round_index, gc.call_index, at.number)
    )
    for row in result:
        yield {"kind": "attempt", "accepted": row.rejected_by is None, **plain(row)}


def export_task_results(connection: Connection, name: str) -> Iterator[dict[str, Any]]:
    """Yield one flat record per task result of campaign ``name``, by batch and index."""
    cid = require_campaign(connection, name)
    batches = connection.execute(
        select(BATCHES.c.id, BATCHES.c.key, BATCHES.c.round_index)
        .where(BATCHES.c.campaign_id == cid)
        .order_by(BATCHES.c.id)
    ).all()
    for batch in batches:
        for record in task_records(connection, batch.id):
            yield {
                "kind": "task_result",
                "batch": batch.key,
                "round_index": batch.round_index,
                **as_dict(record),
            }
