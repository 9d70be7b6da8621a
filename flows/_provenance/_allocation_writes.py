"""The store's record of batch allocations: one row per scheduler job, kept up to date.

The executor's ``AllocationWatch`` hands over every job's record whenever one
changes (requested, started, ended and why); ``record_allocations`` upserts them
on (campaign, job id). Task results name their job; ``record_batch_results``
copies that job's start and planned end onto each result row, and a job whose start
becomes known after some of its results were recorded gives them its window then.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, select, update

from flows._provenance._rows import field, now, utc
from flows._provenance._schema import ALLOCATION_END_REASONS, Allocation, table
from flows._provenance._tables import BATCHES, TASK_RESULTS
from flows._provenance._writes import StoreBase, check_choice, in_transaction, insert_ignore

ALLOCATIONS = table(Allocation)
_COLUMNS = (
    "request",
    "state",
    "reason",
    "nodes",
    "node_count",
    "requested_at",
    "started_at",
    "ends_at",
    "ended_at",
    "end_reason",
)
_TIMES = frozenset({"requested_at", "started_at", "ends_at", "ended_at"})


def _moment(value: Any) -> datetime | None:
    """Return epoch seconds (the executor's records) or a datetime as aware UTC."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC)
    return utc(value)


def allocation_values(record: Any) -> dict[str, Any]:
    """Return an allocation record (``tasks.AllocationRecord`` or a dict) as column values."""
    values = {name: field(record, name) for name in _COLUMNS}
    for name in _TIMES:
        values[name] = _moment(values[name])
    values["nodes"] = list(values["nodes"] or ())
    values["node_count"] = int(values["node_count"] or 0)
    values["request"] = int(values["request"] or 0)
    if values["end_reason"] is not None:
        check_choice(values["end_reason"], ALLOCATION_END_REASONS, "end_reason")
    return values


class AllocationWrites(StoreBase):
    """Record and read the allocations (scheduler jobs) a campaign's workers ran in."""

    def record_allocations(self, campaign: str, records: Iterable[Any]) -> None:
        """Insert or update one row per job (``job_id``), in one transaction."""
        rows = [(str(field(r, "job_id")), allocation_values(r)) for r in records]
        if not rows:
            return

        def work(connection: Connection) -> None:
            cid = self._id(connection, campaign)
            moment = now()
            for job_id, values in rows:
                insert_ignore(
                    connection,
                    ALLOCATIONS,
                    {"campaign_id": cid, "job_id": job_id, "updated_at": moment, **values},
                    ("campaign_id", "job_id"),
                )
                connection.execute(
                    update(ALLOCATIONS)
                    .where(ALLOCATIONS.c.campaign_id == cid, ALLOCATIONS.c.job_id == job_id)
                    .values(updated_at=moment, **values)
                )
                if values["started_at"] is not None:
                    _fill_windows(connection, cid, job_id, values["started_at"], values["ends_at"])

        in_transaction(self.engine, work)


def _fill_windows(
    connection: Connection, cid: int, job_id: str, start: datetime, end: datetime | None
) -> None:
    """Give the job's task results recorded before its start was known their window.

    Short tasks can finish before the scheduler is next asked when the job started
    (``squeue`` every ``scheduler.poll_seconds``); their rows got no window then.
    """
    t = TASK_RESULTS.c
    campaign_batches = select(BATCHES.c.id).where(BATCHES.c.campaign_id == cid)
    connection.execute(
        update(TASK_RESULTS)
        .where(
            t.job_id == job_id,
            t.allocation_start.is_(None),
            t.batch_id.in_(campaign_batches),
        )
        .values(allocation_start=start, allocation_end=end)
    )


def allocation_times(connection: Connection, cid: int) -> dict[str, tuple[Any, Any]]:
    """Return each recorded job's (start, planned end), by job id."""
    a = ALLOCATIONS.c
    return {
        str(r.job_id): (r.started_at, r.ends_at)
        for r in connection.execute(
            select(a.job_id, a.started_at, a.ends_at).where(a.campaign_id == cid)
        )
    }
