"""What ``unattended status`` says of a run's recovery: the watchdog's plan, in words.

``recovery_note`` plans the run's campaign as the runner's watchdog plans it
(``flows._prefect._recovery_plan.plan``, over the deployment's runs, with the same
provenance and the runs the runner's processes execute) and describes what that plan
does about the run: when it is ended as orphaned, continued, stopped by the cap, or
recorded cancelled. It never says more than the watchdog will do.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun

from flows._engine._fencing import RecoverySettings
from flows._engine._registration import registered_parameters
from flows._prefect import _recovery_reads as reads
from flows._prefect._endings import deployment_runs
from flows._prefect._recovery_plan import (
    EXHAUSTED_CODE,
    Action,
    Continue,
    CrashOrphan,
    EndCancel,
    RecordCancel,
    SeenRun,
    Settle,
    StopExhausted,
    plan,
)
from policies import UnattendedError

__all__ = ["recovery_note", "recovery_note_of"]


def recovery_note_of(
    flow_run_id: UUID, *, runner_alive: bool, runner_pid: int | None = None
) -> str | None:
    """Return ``recovery_note`` for the run ``flow_run_id`` (read through Prefect's client).

    ``runner_pid`` is the runner serving this state directory: the runs its processes
    execute are alive, as its watchdog sees them. The note is planned over every run of
    the run's deployment, as the watchdog plans it.
    """

    async def read() -> tuple[FlowRun, list[FlowRun]]:
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            others = await deployment_runs(client, run.deployment_id) if run.deployment_id else []
            return run, others

    alive = reads.flow_runs_alive_here(runner_pid) if runner_alive and runner_pid else set()
    flow_run, runs = asyncio.run(read())
    return recovery_note(flow_run, runner_alive=runner_alive, alive=alive, runs=runs)


def recovery_note(
    flow_run: FlowRun,
    *,
    runner_alive: bool,
    alive: frozenset[str] | set[str] = frozenset(),
    runs: list[FlowRun] | None = None,
) -> str | None:
    """Say whether the system is about to recover ``flow_run``'s campaign, when and why.

    Only what the watchdog will do is said: the same plan (``runs``: the deployment's
    runs, ``flow_run`` alone by default), the same runs alive (``alive``). A run whose
    parameters are not its campaign's registration is never continued, and its
    campaign is opened from the registration, never from the run.
    """
    settings = RecoverySettings.from_env(os.environ)
    now = datetime.now(UTC)
    registered = registered_parameters(flow_run.deployment_id, os.environ)
    if registered is not None and dict(flow_run.parameters) != registered:
        return None  # refused by the flow and the watchdog, never continued
    try:
        name, store = reads.campaign_store(flow_run)
    except (UnattendedError, OSError, KeyError):
        return None
    try:
        # The cap the runner counts against (its setting), as it recorded it.
        cap, stopped_after = reads.recorded_cap(store, name)
        tally = reads.continuations(store, name, cap or settings.max_continuations)
        record = reads.read_record(store, name, tally)
    finally:
        store.close()
    if record.status == "failed" and record.code == EXHAUSTED_CODE:
        return (
            f"stopped ({EXHAUSTED_CODE}): continued {stopped_after or tally.cap} times "
            "without progress; fix the cause, then 'unattended submit' continues it"
        )
    others = [r for r in (runs or []) if r.id != flow_run.id]
    seen = [reads.seen_run(r, registered, alive, now) for r in [flow_run, *others]]
    actions = plan(seen, record, now, settings)
    return _describe(seen[0], actions, runner_alive=runner_alive, now=now, settings=settings)


def _describe(
    run: SeenRun,
    actions: list[Action],
    *,
    runner_alive: bool,
    now: datetime,
    settings: RecoverySettings,
) -> str | None:
    """Say what ``actions`` (the campaign's plan) do about ``run``, in words (None: nothing)."""
    mine = [a for a in actions if getattr(a, "run_id", None) == run.id]
    follow = next(
        (a for a in actions if isinstance(a, Continue | StopExhausted) and a.after == run.id), None
    )
    if run.state == "CANCELLING":
        return _cancelling_note(mine, runner_alive=runner_alive, settings=settings)
    who = (
        _who_continues(follow, now, settings)
        if runner_alive
        else ("no runner is serving: 'unattended serve --detach' continues it")
    )
    for action in mine:
        match action:
            case CrashOrphan(why=why, at=at) if at <= now:
                return f"orphaned: {why}; {who}"
            case CrashOrphan(at=at) if runner_alive:
                # A live run takes the lease as it starts and renews it every heartbeat:
                # one that holds none for longer is forced into its state, or still
                # starting on a slow day (this process cannot see which run a forked
                # child of the runner executes).
                lease_less = (now - run.since).total_seconds()
                if lease_less > settings.heartbeat_seconds:
                    return (
                        f"holds no lease after {lease_less:.0f} s: unless a process of the "
                        "runner is still starting it, it was forced into its state (through "
                        "the API) and the runner ends it as orphaned in "
                        f"{(at - now).total_seconds():.0f} s, then continues the campaign"
                    )
            case Settle(ending=ending, at=at) if at <= now:
                code = f", {ending.code}" if ending.code else ""
                return (
                    f"finished ({ending.status}{code}) but its process ended before Prefect "
                    f"heard of it: the runner sets its state from the recorded ending; {who}"
                )
            case RecordCancel():
                return (
                    "cancelled (not by a runner's shutdown): the runner records the campaign "
                    f"as cancelled within {settings.watchdog_seconds:g} s"
                )
    if follow is not None:
        return f"interrupted: {follow.why}; {who}"
    return None


def _cancelling_note(
    mine: list[Action], *, runner_alive: bool, settings: RecoverySettings
) -> str | None:
    """Say who ends a Cancelling run, and when (the plan's ``EndCancel``)."""
    if not runner_alive:
        return (
            "cancel asked; no runner is serving to stop it: 'unattended serve --detach' "
            "ends it as cancelled, and so does 'unattended cancel NAME'"
        )
    left_open = next((a for a in mine if isinstance(a, EndCancel)), None)
    if left_open is not None and left_open.at <= datetime.now(UTC):
        return (
            f"cancel asked and nobody is left to stop it ({left_open.why}): the runner ends "
            f"it as cancelled within {settings.watchdog_seconds:g} s"
        )
    return None  # the runner is stopping it


def _who_continues(
    follow: Continue | StopExhausted | None, now: datetime, settings: RecoverySettings
) -> str:
    """Say when the runner continues a campaign, its cap and backoff counted."""
    match follow:
        case StopExhausted(count=count):
            return (
                f"continued {count} times without progress: the runner stops it "
                f"({EXHAUSTED_CODE}) instead of continuing it"
            )
        case Continue(at=at, counted=counted, number=number, cap=cap):
            within = max(settings.watchdog_seconds, (at - now).total_seconds())
            return f"the runner continues it within {within:.0f} s" + (
                f" (continuation {number} of {cap})" if counted else ""
            )
    return "the runner continues the campaign if it is still going"
