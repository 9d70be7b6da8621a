"""The allocations an executor holds: requested, started, ended, and why; watched while it runs.

An *allocation* here is one batch job that carries the site's workers (a
dask-jobqueue worker job, a RADICAL-Pilot pilot). ``AllocationWatch`` keeps one
``AllocationRecord`` per job, polls ``squeue`` every ``poll_seconds`` in the
background, and resolves ``lost`` once every job of the current request has ended,
so tasks still waiting for a worker come back ``interrupted`` instead of waiting
forever. The campaign then asks for the next allocation (``AllocationWatch.request``
through the executor), within the site's budget of allocations and node-hours.

An allocation of several jobs (Dask workers as jobs spread over nodes) can lose one
while the others run on: ``on_job_ended`` is then called with that job, once, so
the backend retires its workers (a job Slurm failed may leave them running on a
node whose ``slurmd`` died) and its tasks run again on the jobs still alive.

Only Slurm's answer ends a job: ``squeue`` exiting 0 without it (or with a final
state), never a query that failed. While the controller does not answer (a
restart, a failover) every job stays as last seen, nothing is killed or
requested, and the outage is reported (``on_outage``); after
``unreachable_seconds`` without an answer the jobs are given up as ended ``unknown``.

The budget is the campaign's, not this process's: a watch starts from ``BudgetUsed``,
what the campaign's provenance records of earlier runs (requests made, node-hours
charged), so a campaign whose runs crash and are continued stops at its limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from policies import BudgetExceeded
from tasks._slurm import (
    AllocationState,
    EndReason,
    SlurmQueryFailed,
    describe_queue,
    query_jobs,
)

logger = logging.getLogger("unattended.tasks.allocations")

#: How an allocation ended; ``released`` means the campaign let it go itself.
AllocationEnd = EndReason | Literal["released"]
Submit = Callable[[], Awaitable[Sequence[str]]]
OnChange = Callable[[list["AllocationRecord"]], None]
OnJobEnded = Callable[[list["AllocationRecord"]], Awaitable[None]]
#: Called with ``(kind, details)`` when the batch system stops or starts answering.
OnOutage = Callable[[str, dict[str, object]], None]
#: The outage events: no answer (first seen), answering again, and given up on.
OUTAGE_EVENTS = ("slurm_unreachable", "slurm_reachable", "slurm_unreachable_gave_up")
#: Seconds a backend may take to retire the workers of a job that ended alone.
RETIRE_TIMEOUT = 60.0


@dataclass(frozen=True)
class BudgetUsed:
    """What earlier runs of the campaign used of the allocation budget.

    ``requests`` counts the allocations they requested; ``node_hours`` the node-hours
    their jobs were charged (a job a crashed run left open counts until its planned
    end, or until now when that is earlier).
    """

    requests: int = 0
    node_hours: float = 0.0


@dataclass(frozen=True)
class AllocationRecord:
    """One batch job that carried workers: when it was asked for, ran, ended, and why.

    ``ends_at`` is the scheduler's planned end (start + walltime) while the job
    runs; ``ended_at`` is when it really ended. ``request`` counts the campaign's requests
    (1 for its first allocation, earlier runs included), so jobs of one request share it.
    """

    job_id: str
    request: int
    requested_at: float
    state: str = "PENDING"
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    started_at: float | None = None
    ends_at: float | None = None
    ended_at: float | None = None
    end_reason: AllocationEnd | None = None

    @property
    def ended(self) -> bool:
        """True once the job has ended (or was released)."""
        return self.end_reason is not None

    def node_hours(self, now: float | None = None) -> float:
        """Return node-hours used so far (nodes x hours between start and end or now)."""
        if self.started_at is None:
            return 0.0
        stop = self.ended_at if self.ended_at is not None else (now or time.time())
        return max(0.0, stop - self.started_at) * max(self.node_count, 1) / 3600.0

    def describe(self) -> str:
        """Return ``job 12 PENDING (Resources)``, the words a person reads in a queue."""
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"job {self.job_id} {self.state}{why}"


class AllocationWatch:
    """Watch the batch jobs of one executor and say when none is left to run tasks.

    Args:
        submit: Starts the jobs of one allocation and returns their job ids.
        env: Environment of the Slurm clients (``SLURM_CONF``).
        poll_seconds: How often ``squeue`` is asked while the executor runs.
        max_allocations: Requests allowed (the first included); None means no limit.
        max_node_hours: Node-hours the jobs may use in all; None means no limit.
        used: What earlier runs of the campaign used; both limits count it.
        unreachable_seconds: How long ``squeue`` may fail before the jobs are given up.

    ``on_change`` (settable) is called with every record after a request and after
    any poll that changed one: the campaign writes them to its provenance.
    ``on_job_ended`` (settable, by the backend) is awaited with the jobs of the
    current request that Slurm ended while others of it still run, once per job.
    ``on_outage`` (settable) is called with one of ``OUTAGE_EVENTS`` and its details.
    """

    def __init__(
        self,
        submit: Submit,
        *,
        env: Mapping[str, str],
        poll_seconds: float,
        max_allocations: int | None = None,
        max_node_hours: float | None = None,
        used: BudgetUsed | None = None,
        unreachable_seconds: float = 300.0,
    ) -> None:
        self._submit = submit
        self.unreachable_seconds = unreachable_seconds
        self._unreachable_since: float | None = None
        self.on_outage: OnOutage | None = None
        self._env = dict(env)
        self.poll_seconds = poll_seconds
        self.max_allocations = max_allocations
        self.max_node_hours = max_node_hours
        self._records: dict[str, AllocationRecord] = {}
        self._current: list[str] = []
        self.used = used or BudgetUsed()
        self._requests = self.used.requests
        self._lost: asyncio.Future[AllocationRecord] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._catching_up: asyncio.Future[None] | None = None
        self._ended_alone: set[str] = set()
        self.on_change: OnChange | None = None
        self.on_job_ended: OnJobEnded | None = None

    # ---- what callers read -------------------------------------------------------
    @property
    def records(self) -> list[AllocationRecord]:
        """Return every job's record, oldest request first."""
        return list(self._records.values())

    @property
    def current(self) -> list[AllocationRecord]:
        """Return the records of the latest request."""
        return [self._records[job_id] for job_id in self._current]

    @property
    def requests(self) -> int:
        """Return how many allocations the campaign requested so far (earlier runs included)."""
        return self._requests

    @property
    def lost(self) -> asyncio.Future[AllocationRecord]:
        """Return a future resolved (with the last job to end) when the current jobs all ended."""
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
        return self._lost

    @property
    def is_lost(self) -> bool:
        """True when every job of the current request has ended."""
        return self._lost is not None and self._lost.done()

    def queue_line(self) -> str:
        """Return ``waiting in queue: job 12 PENDING (Resources)``, or '' when nothing waits."""
        states = [
            AllocationState(job_id=r.job_id, state=r.state, reason=r.reason) for r in self.current
        ]
        return describe_queue(states)

    def seconds_left(self, now: float | None = None) -> float | None:
        """Return seconds until the current jobs' planned end; None when none runs yet."""
        end = self.ends_at()
        return None if end is None else max(0.0, end - (time.time() if now is None else now))

    def ends_at(self) -> float | None:
        """Return the earliest planned end of the current running jobs, if known."""
        ends = [r.ends_at for r in self.current if r.started_at is not None and not r.ended]
        known = [end for end in ends if end is not None]
        return min(known) if known else None

    def node_hours(self) -> float:
        """Return node-hours the campaign used so far: earlier runs' plus this watch's jobs."""
        now = time.time()
        return self.used.node_hours + sum(r.node_hours(now) for r in self._records.values())

    # ---- what the executor does ---------------------------------------------------
    async def request(self) -> list[AllocationRecord]:
        """Start the next allocation's jobs, within the budget; return their records.

        Raises:
            BudgetExceeded: ``max_allocations`` requests were made already, or the
                jobs used ``max_node_hours``.
        """
        async with self._lock:
            if self.max_allocations is not None and self._requests >= self.max_allocations:
                raise BudgetExceeded(
                    f"allocation budget used: {self._requests} of "
                    f"scheduler.max_allocations={self.max_allocations} requested "
                    f"by the campaign ({self.used.requests} by earlier runs)",
                    details={
                        "field": "scheduler.max_allocations",
                        "used": self._requests,
                        "earlier_runs": self.used.requests,
                    },
                )
            used = self.node_hours()
            if self.max_node_hours is not None and used >= self.max_node_hours:
                raise BudgetExceeded(
                    f"allocation budget used: {used:.3g} of "
                    f"scheduler.max_node_hours={self.max_node_hours:g} node-hours "
                    f"by the campaign ({self.used.node_hours:.3g} by earlier runs)",
                    details={
                        "field": "scheduler.max_node_hours",
                        "used": used,
                        "earlier_runs": self.used.node_hours,
                    },
                )
            self._requests += 1
            # Jobs of the last request still queued or running are let go (the
            # submitter cancels them): the campaign asked for a fresh allocation.
            self._release(self._current)
            requested_at = time.time()
            job_ids = [str(job_id) for job_id in await self._submit()]
            for job_id in job_ids:
                self._records[job_id] = AllocationRecord(
                    job_id=job_id, request=self._requests, requested_at=requested_at
                )
            self._current = job_ids
            if self._lost is not None and self._lost.done():
                self._lost = None
            logger.info("requested allocation %d: jobs %s", self._requests, ", ".join(job_ids))
        await self.refresh(changed=True)
        return self.current

    async def refresh(self, *, changed: bool = False) -> None:
        """Ask ``squeue`` about every job not yet ended; resolve ``lost`` when all ended."""
        open_ids = [job_id for job_id, r in self._records.items() if not r.ended]
        before = dict(self._records)
        if open_ids:
            asked_at = time.time()  # squeue may try for ~20 s before it gives up
            try:
                states = await asyncio.to_thread(query_jobs, open_ids, env=self._env)
            except SlurmQueryFailed as exc:
                if not self._no_answer(open_ids, exc, asked_at):
                    return
                states = {}  # given up: every open job ends "unknown" below
            except (OSError, ValueError) as exc:
                logger.warning("squeue failed (%s); allocation states not refreshed", exc)
                return
            else:
                self._answered()
            now = time.time()
            for job_id in open_ids:
                self._update(job_id, states.get(job_id), now)
        current = self.current
        if current and all(r.ended for r in current):
            future = self.lost
            if not future.done():
                last = max(current, key=lambda r: r.ended_at or 0.0)
                future.set_result(last)
        if changed or self._records != before:
            self._notify()
        await self._retire_ended_alone(current)

    @property
    def unreachable_since(self) -> float | None:
        """Return since when the batch system has not answered, or None while it does."""
        return self._unreachable_since

    def _no_answer(self, open_ids: Sequence[str], exc: SlurmQueryFailed, asked_at: float) -> bool:
        """Note a query the controller did not answer; return True once it is given up on."""
        now = time.time()
        if self._unreachable_since is None:
            self._unreachable_since = asked_at
            logger.warning(
                "Slurm does not answer (%s): jobs %s are left as they were; nothing is "
                "killed or requested for up to scheduler.unreachable_seconds=%g s",
                exc,
                ", ".join(open_ids),
                self.unreachable_seconds,
            )
            self._tell_outage(
                "slurm_unreachable",
                {"jobs": list(open_ids), "since": asked_at, "message": str(exc)},
            )
        waited = now - self._unreachable_since
        if waited < self.unreachable_seconds:
            return False
        logger.error(
            "Slurm has not answered for %.0f s (scheduler.unreachable_seconds=%g): "
            "jobs %s are given up as ended 'unknown'",
            waited,
            self.unreachable_seconds,
            ", ".join(open_ids),
        )
        self._tell_outage(
            "slurm_unreachable_gave_up",
            {"jobs": list(open_ids), "since": self._unreachable_since, "seconds": waited},
        )
        self._unreachable_since = None
        return True

    def _answered(self) -> None:
        """Note that the controller answered; report the end of an outage."""
        since = self._unreachable_since
        if since is None:
            return
        self._unreachable_since = None
        seconds = time.time() - since
        logger.warning("Slurm answers again after %.0f s without an answer", seconds)
        self._tell_outage("slurm_reachable", {"since": since, "seconds": seconds})

    def _tell_outage(self, kind: str, details: dict[str, object]) -> None:
        if self.on_outage is None:
            return
        try:
            self.on_outage(kind, details)
        except Exception:  # recording it must not stop the tasks
            logger.exception("recording the Slurm outage failed")

    async def _retire_ended_alone(self, current: list[AllocationRecord]) -> None:
        """Hand the jobs Slurm ended while their peers run on to ``on_job_ended``, once each."""
        if self.on_job_ended is None or all(r.ended for r in current):
            return
        ended = [
            r
            for r in current
            if r.ended and r.end_reason != "released" and r.job_id not in self._ended_alone
        ]
        if not ended:
            return
        self._ended_alone.update(r.job_id for r in ended)
        logger.warning(
            "%s ended while %d job(s) of the allocation run on: retiring its workers",
            ", ".join(r.describe() for r in ended),
            sum(not r.ended for r in current),
        )
        try:
            async with asyncio.timeout(RETIRE_TIMEOUT):
                await self.on_job_ended(ended)
        except Exception:  # the next request retires them anyway
            logger.exception("retiring the workers of %s failed", [r.job_id for r in ended])

    async def saw_task_in(self, job_id: str | None) -> None:
        """A task ran in ``job_id``: if that job has not been seen start, ask ``squeue`` now.

        A job can start and run short tasks between two polls; until the next one it
        would still read PENDING (the queue line) and have no start time (the window
        its results are recorded with). One query serves every result arriving meanwhile.
        """
        record = self._records.get(str(job_id)) if job_id else None
        if record is None or record.started_at is not None or record.ended:
            return
        if self._catching_up is None or self._catching_up.done():
            self._catching_up = asyncio.ensure_future(self.refresh())
        await asyncio.shield(self._catching_up)

    def _update(self, job_id: str, state: AllocationState | None, now: float) -> None:
        record = self._records[job_id]
        if state is None:
            # The controller forgot the job (MinJobAge passed, or it restarted).
            self._records[job_id] = replace(
                record, state="UNKNOWN", ended_at=record.ended_at or now, end_reason="unknown"
            )
            return
        changes: dict[str, object] = {"state": state.state, "reason": state.reason}
        if state.nodes:
            changes["nodes"] = state.nodes
        if state.node_count:
            changes["node_count"] = state.node_count
        if state.started_at is not None:
            changes["started_at"] = state.started_at
        if state.ended:
            changes["ended_at"] = state.ends_at or now
            changes["end_reason"] = state.end_reason
        elif state.ends_at is not None:
            changes["ends_at"] = state.ends_at
        self._records[job_id] = replace(record, **changes)  # type: ignore[arg-type]  # keys are record fields

    def mark_released(self) -> None:
        """Record the jobs still open as released by the campaign (it is closing them)."""
        self._release(list(self._records))
        self._notify()

    def _notify(self) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(self.records)
        except Exception:  # recording them must not stop the tasks
            logger.exception("recording the allocations failed")

    def _release(self, job_ids: Sequence[str]) -> None:
        now = time.time()
        for job_id in job_ids:
            record = self._records[job_id]
            if not record.ended:
                self._records[job_id] = replace(
                    record, state="RELEASED", ended_at=now, end_reason="released"
                )

    def start(self) -> None:
        """Poll in the background until ``stop``."""
        if self._poller is None:
            self._poller = asyncio.ensure_future(self._poll())

    async def stop(self) -> None:
        """Stop polling."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                await self.refresh()
            except Exception:  # a failed poll must not end the watch
                logger.exception("allocation poll failed")
