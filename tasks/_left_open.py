"""End the batch jobs an earlier, crashed run of the campaign left open (``retire_left_open``).

The jobs of the run that is going on are watched by ``tasks._allocations.AllocationWatch``;
these are the ones no process watches any more, settled once before a new run asks
for its own.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tasks._allocations import AllocationRecord
from tasks._slurm import cancel_jobs, query_jobs
from tasks._task_ledger import RESULTS_FOLDER, jobs_with_open_tasks

__all__ = ["retire_left_open"]

logger = logging.getLogger("unattended.tasks.allocations")


def retire_left_open(
    records: Sequence[AllocationRecord],
    *,
    env: Mapping[str, str],
    campaign_dir: str | os.PathLike[str] | None = None,
) -> list[AllocationRecord]:
    """End the jobs an earlier run of the campaign left open; return their records, ended.

    A run that crashed never released its jobs. Their workers (or pilot) served
    that run's process only, so nothing can use them now: the ones still queued or
    running are cancelled (``released``: the campaign let them go), the ones that
    ended meanwhile get their end as Slurm tells it, and the ones the controller
    forgot end ``unknown`` (at their planned end, or now if that is earlier).

    Jobs the campaign's task ledger (``campaign_dir/task-results``, ``tasks._task_ledger``)
    names as running a task of the dead run with no result yet are spared: the
    next run waits for those results, so the jobs are neither cancelled nor
    recorded ended here; they end by themselves once their workers are gone.

    Raises:
        SlurmQueryFailed: the controller did not answer (the jobs stay open).
        OSError: ``squeue`` or ``scancel`` cannot be run.
    """
    busy = (
        set()
        if campaign_dir is None
        else jobs_with_open_tasks(os.path.join(campaign_dir, RESULTS_FOLDER))
    )
    left_open = [r for r in records if not r.ended and r.job_id not in busy]
    if busy:
        logger.info("jobs %s still run tasks of an earlier run: waited for", sorted(busy))
    if not left_open:
        return []
    states = query_jobs([r.job_id for r in left_open], env=env)
    cancel_jobs([j for j, state in states.items() if not state.ended], env=env)
    now = time.time()
    ended = []
    for record in left_open:
        state = states.get(record.job_id)
        if state is None:
            stop = now if record.ends_at is None else min(now, record.ends_at)
            ended.append(replace(record, state="UNKNOWN", ended_at=stop, end_reason="unknown"))
            continue
        known = replace(
            record,
            reason=state.reason,
            nodes=state.nodes or record.nodes,
            node_count=state.node_count or record.node_count,
            started_at=state.started_at or record.started_at,
        )
        if state.ended:
            ended.append(
                replace(
                    known,
                    state=state.state,
                    ended_at=state.ends_at or now,
                    end_reason=state.end_reason,
                )
            )
        else:
            ended.append(replace(known, state="RELEASED", ended_at=now, end_reason="released"))
    logger.info("ended %d job(s) an earlier run left open", len(ended))
    return ended
