"""Crashed runs come back by themselves: the runner's watchdog finds and continues them.

Every ``watchdog_seconds`` the runner (``CampaignService``) looks at each campaign
deployment:

* a run that is *Running* or *Pending* but whose campaign lease says its process
  is gone (same host: the holder's pid no longer exists) or expired
  (``lease_ttl_seconds`` without a heartbeat), or that never took the lease within
  the TTL, is an **orphan**: it is marked *Crashed* through the API (which also
  frees the deployment's concurrency slot) and a ``orphan_crashed`` event is recorded;
* when the campaign then has no active run and its newest run was *Crashed*,
  *Cancelled* by a runner's own shutdown, or *Failed* with ``storage_unavailable``,
  and the provenance says the campaign is still running or awaiting approval, a
  new run of the deployment is started and a ``continued`` event records why. It
  reads the checkpoint and goes on.

Continuations after a crash or a failure are the campaign's, counted in its
provenance (``continued`` events marked ``counted``, with the campaign's progress
when they were made), so the cap and the backoff hold across runner restarts: at
most ``max_continuations`` (a setting, ``UNATTENDED_MAX_CONTINUATIONS``, default
``MAX_CONTINUATIONS``) in a row without progress (a round completed or a task
result recorded), the k-th waiting ``watchdog_seconds * 2**(k-2)`` after the one
before. The next one is refused: the campaign is recorded ``failed`` with
``continuations_exhausted`` (event of the same kind) and its notice is sent.
A run cancelled by a runner's own shutdown is an operator's act and is not counted.

``recovery_note`` gives ``unattended status`` the same diagnosis in words.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psutil
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.states import Cancelled, Crashed

from flows._engine._direct import open_store
from flows._engine._fencing import RecoverySettings
from flows._engine._registration import (
    Registration,
    registered_parameters,
    registration_for,
    registrations,
)
from flows._paths import state_dir_from
from flows._prefect._endings import cancelled_by_a_person, notify_stopped, record_cancelled
from flows._prefect._warm_start import flow_runs_started_here
from flows._provenance import LeaseRow, ProvenanceStore
from flows._provenance._readers import Progress
from flows._spec import load_campaign
from policies import UnattendedError
from tasks import load_site

# The message Prefect's runner puts on the runs it cancels when it stops.
SHUTDOWN_MESSAGE = "Runner is shutting down."
# The message of a Cancelling run the watchdog ended: nobody was left to stop it.
CANCEL_ENDED = "cancelled with no process left to stop"
ACTIVE = {
    StateType.SCHEDULED,
    StateType.PENDING,
    StateType.RUNNING,
    StateType.PAUSED,
    StateType.CANCELLING,
}
CONTINUABLE_STATUSES = frozenset({"running", "awaiting_approval"})
TRANSIENT_CODE = "storage_unavailable"
EXHAUSTED_CODE = "continuations_exhausted"
# Automatic continuations after a crash or a transient failure, in a row without
# progress, per campaign (counted in its provenance, whatever runner made them): the
# default of the setting ``max_continuations``.
MAX_CONTINUATIONS = RecoverySettings.max_continuations

_log = logging.getLogger(__name__)


def _seconds_since(moment: datetime, now: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (now - moment).total_seconds()


def flow_runs_alive_here(root: int | None = None) -> set[str]:
    """Return the ids of the flow runs that a process's descendants are executing.

    Prefect's runner starts each flow run as a child process with
    ``PREFECT__FLOW_RUN_ID`` in its environment; a run found here is alive, whatever
    its lease says (it may still be starting, on a machine that is slow today).
    ``root`` is the runner's pid (default: this process, the runner's own watchdog,
    which also counts the runs it forked from its forkserver: their environment is set
    after the fork, where /proc does not show it); an unknown or gone pid has no
    descendants.
    """
    alive: set[str] = flow_runs_started_here() if root is None else set()
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return alive
    for child in children:
        with contextlib.suppress(psutil.Error):
            run_id = child.environ().get("PREFECT__FLOW_RUN_ID")
            if run_id:
                alive.add(run_id)
    return alive


def orphan_reason(
    flow_run: FlowRun,
    lease: LeaseRow | None,
    settings: RecoverySettings,
    now: datetime,
    alive_here: frozenset[str] | set[str] = frozenset(),
    *,
    judged: frozenset[StateType] = frozenset({StateType.RUNNING, StateType.PENDING}),
) -> str | None:
    """Return why a Running/Pending run is an orphan, or None when it looks alive.

    A run holding the lease is an orphan when the lease's process is gone or the
    lease expired. A run without it is one when no process of the runner executes it
    (``alive_here``) and it has been in its state for longer than the lease TTL: a
    live run takes the lease as it starts, and only the runner starts runs, so such a
    run was left by a runner that is gone, or forced into its state through the API
    (by anyone holding the server's secret) with nothing behind it.
    """
    state = flow_run.state
    if state is None or state.type not in judged:
        return None
    if str(flow_run.id) in alive_here:
        return None
    if lease is not None and lease.owner == str(flow_run.id) and not lease.released:
        if lease.holder_gone():
            return f"its process (pid {lease.pid}) is gone"
        if lease.expired(now):
            return f"lease expired {_seconds_since(lease.expires_at, now):.0f} s ago"
        return None
    age = _seconds_since(state.timestamp, now)
    if age > settings.lease_ttl_seconds:
        return f"{state.type.value.lower()} for {age:.0f} s without holding the campaign's lease"
    return None


def orphan_in(
    flow_run: FlowRun,
    lease: LeaseRow | None,
    settings: RecoverySettings,
    now: datetime,
    alive_here: frozenset[str] | set[str] = frozenset(),
) -> float | None:
    """Return in how many seconds ``orphan_reason`` calls this run an orphan, all else equal.

    None when it never will on its own (it holds a live lease, a process of the runner
    executes it, or it is not Running/Pending), 0 when it is one already.
    """
    if orphan_reason(flow_run, lease, settings, now, alive_here) is not None:
        return 0.0
    state = flow_run.state
    if state is None or state.type not in {StateType.RUNNING, StateType.PENDING}:
        return None
    if str(flow_run.id) in alive_here:
        return None
    if lease is not None and lease.owner == str(flow_run.id) and not lease.released:
        return None
    return max(0.0, settings.lease_ttl_seconds - _seconds_since(state.timestamp, now))


def cancel_left_open(
    flow_run: FlowRun,
    lease: LeaseRow | None,
    settings: RecoverySettings,
    now: datetime,
    alive_here: frozenset[str] | set[str] = frozenset(),
) -> str | None:
    """Return why a *Cancelling* run has nobody left to end it, or None.

    Prefect's runner stops only the runs it executes: a run proposed Cancelling while
    its process was gone (the UI's Cancel while the runner tree was down) would stay
    Cancelling forever. It is judged as ``orphan_reason`` judges a running run, once
    it has been Cancelling for a lease TTL: a runner that killed the run's process
    sets Cancelled itself a few seconds later (3.5 s measured), and its ending is the
    one to keep.
    """
    state = flow_run.state
    if state is None or state.type != StateType.CANCELLING:
        return None
    if _seconds_since(state.timestamp, now) < settings.lease_ttl_seconds:
        return None
    cancelling = frozenset({StateType.CANCELLING})
    return orphan_reason(flow_run, lease, settings, now, alive_here, judged=cancelling)


def _may_need_action(runs: list[FlowRun], now: datetime) -> bool:
    """Return whether a sweep could act on these runs (judged from Prefect's states alone).

    Only a Running or Pending run can be an orphan, and only a campaign with no active
    run whose newest run ended in a way worth continuing can be continued. Anything
    else (a completed campaign, one waiting for approval) is skipped before its spec and
    provenance are opened: the watchdog runs every few seconds over every campaign.
    """
    # A Cancelling run may have nobody left to end it (``cancel_left_open``).
    may_be_gone = {StateType.RUNNING, StateType.PENDING, StateType.CANCELLING}
    if any(_state_type(r) in may_be_gone for r in runs):
        return True
    if any(_state_type(r) in ACTIVE for r in runs):
        return False
    newest = max(runs, key=lambda r: r.created or now)
    # A Cancelled newest run may be a person's cancel that the provenance must record.
    return continuation_reason(newest) is not None or _state_type(newest) == StateType.CANCELLED


def _alive_here_only(runs: list[FlowRun], alive_here: set[str]) -> bool:
    """Return whether the runs' only candidates for action are Running or Pending here.

    True when no run is Cancelling and at least one is Running or Pending, each of them
    executed by a process of this runner (``flow_runs_alive_here``): such a campaign
    has no orphan and an active run, so a sweep has nothing to do for it.
    """
    judged = [r for r in runs if _state_type(r) in {StateType.RUNNING, StateType.PENDING}]
    if not judged or any(_state_type(r) == StateType.CANCELLING for r in runs):
        return False
    return all(str(r.id) in alive_here for r in judged)


def _state_type(flow_run: FlowRun) -> StateType | None:
    return flow_run.state.type if flow_run.state is not None else None


def continuation_reason(flow_run: FlowRun) -> str | None:
    """Return why an ended run should be continued by a new one, or None."""
    state = flow_run.state
    if state is None:
        return None
    if state.type == StateType.CRASHED:
        return "its run crashed"
    if state.type == StateType.CANCELLED and (state.message or "") == SHUTDOWN_MESSAGE:
        return "its run was cancelled by a runner's shutdown"
    if state.type == StateType.FAILED and f"({TRANSIENT_CODE})" in (state.message or ""):
        return "its run failed on storage (disk full, read-only or locked)"
    return None


def counted(flow_run: FlowRun) -> bool:
    """Return whether continuing after ``flow_run`` counts toward the cap (a crash, a failure)."""
    return _state_type(flow_run) in {StateType.CRASHED, StateType.FAILED}


@dataclass(frozen=True)
class Continuations:
    """The continuations a campaign had in a row without progress, from its provenance.

    ``count`` counts the ``continued`` events marked ``counted`` that were made at
    the campaign's current ``progress`` since the last ``continuations_exhausted``
    (a person starting the campaign again after the cap starts a new count);
    ``last_at`` is when the newest of them was recorded.
    """

    count: int
    last_at: datetime | None
    progress: Progress
    cap: int = MAX_CONTINUATIONS

    @property
    def exhausted(self) -> bool:
        """True when the cap is reached: the next continuation is refused."""
        return self.count >= self.cap

    def not_before(self, settings: RecoverySettings) -> datetime | None:
        """Return when the next continuation may start (the doubling pause), or None: now."""
        if self.count == 0 or self.last_at is None:
            return None
        pause = settings.watchdog_seconds * 2 ** (self.count - 1)
        return self.last_at + timedelta(seconds=pause)


def _mark(progress: Progress) -> list[int]:
    return [progress.rounds, progress.tasks]


def continuations(store: ProvenanceStore, name: str, cap: int = MAX_CONTINUATIONS) -> Continuations:
    """Count campaign ``name``'s continuations in a row without progress (``Continuations``).

    ``cap`` is the setting ``max_continuations``: how many make the campaign stop.
    """
    progress = store.progress(name)
    count, last_at = 0, None
    for event in store.events(name):
        if event["kind"] == EXHAUSTED_CODE:
            count, last_at = 0, None
        elif event["kind"] == "continued":
            details = event["details"] or {}
            if details.get("counted") and details.get("progress") == _mark(progress):
                count += 1
                moment = event["recorded_at"]
                last_at = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    return Continuations(count=count, last_at=last_at, progress=progress, cap=cap)


def recorded_cap(store: ProvenanceStore, name: str) -> tuple[int | None, int | None]:
    """Return (the cap the runner last counted against, continuations when it stopped).

    Read from the newest ``continued`` and ``continuations_exhausted`` events: the cap
    is the runner's setting, which another process (``status``) need not share.
    """
    cap = stopped_after = None
    for event in store.events(name):
        details = event["details"] or {}
        if event["kind"] == "continued" and details.get("cap") is not None:
            cap = int(details["cap"])
        elif event["kind"] == EXHAUSTED_CODE:
            stopped_after = details.get("continuations")
            cap = int(details.get("cap", cap or MAX_CONTINUATIONS))
    return cap, stopped_after


def campaign_store(flow_run_or_params: FlowRun | dict[str, Any]) -> tuple[str, ProvenanceStore]:
    """Open the provenance store of a campaign run (by its registration) or of parameters.

    A flow run is looked up by its deployment among this state directory's
    registrations, never by the parameters it carries (``KeyError`` when it is not
    one of ours); parameters are taken as given (the caller read them from one).
    """
    if isinstance(flow_run_or_params, FlowRun):
        registration = registration_for(
            state_dir_from(None, os.environ), flow_run_or_params.deployment_id
        )
        if registration is None:
            raise KeyError(str(flow_run_or_params.deployment_id))
        params = registration.parameters
    else:
        params = flow_run_or_params
    loaded = load_campaign(params["spec_path"])
    site = load_site(params.get("site") or loaded.spec.site, env=os.environ)
    home = state_dir_from(params.get("state_dir"), os.environ)
    return loaded.spec.name, open_store(site, loaded, home)


def _status(store: ProvenanceStore, name: str) -> tuple[str | None, str | None]:
    found = next((c for c in store.campaigns() if c["name"] == name), None)
    return (found["status"], found["error_code"]) if found else (None, None)


@dataclass
class Watchdog:
    """What the runner's watchdog remembers between sweeps (continuations are in the provenance)."""

    settings: RecoverySettings
    state_dir: Path | None = None
    # Continuations whose ``continued`` event could not be written (a full disk):
    # counted here too, by campaign, so the cap and the pause hold while storage fails.
    unrecorded: dict[str, Continuations] = field(default_factory=dict)
    # Cancelled runs whose ending is recorded already (not read again every sweep).
    settled_cancels: set[str] = field(default_factory=set)
    # Runs of another's making whose refusal is recorded already.
    refused_runs: set[str] = field(default_factory=set)
    # Ended runs of a campaign that stopped for good, whose "left" line is said already.
    left_stopped: set[str] = field(default_factory=set)
    # Held while one campaign is judged; a submission takes it too (CampaignService).
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def sweep(self, *, now: datetime | None = None) -> list[str]:
        """Crash orphans and continue interrupted campaigns; return what was done."""
        moment = now or datetime.now(UTC)
        done: list[str] = []
        # Only what the owner registered in this state directory, with the registered
        # parameters: a deployment on the server (anyone holding the secret can make or
        # change one) is never the authority on what to run (flows._engine._registration).
        registered = {r.deployment_id: r for r in registrations(self.home)}
        if not registered:
            return done
        # Read once a sweep, not once a running campaign: it reads the environment of
        # every process under the runner.
        alive = flow_runs_alive_here()
        async with get_client() as client:
            deployments = await client.read_deployments(
                deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[UUID(key) for key in registered])
                )
            )
            for deployment in deployments:
                registration = registered[str(deployment.id)]
                try:
                    # One campaign at a time under the lock: a submission (which writes
                    # the registration, then starts a run) waits for one campaign's
                    # judgement, never for a whole sweep, and is never judged half-made.
                    async with self.lock:
                        done += await self._sweep_one(
                            client, deployment, registration, moment, alive
                        )
                except UnattendedError as exc:  # a spec that no longer loads: a human's call
                    _log.warning("watchdog: %s: %s", deployment.name, exc.code)
        return done

    async def _sweep_one(
        self,
        client: Any,
        deployment: Any,
        registration: Registration,
        now: datetime,
        alive: set[str],
    ) -> list[str]:
        runs: list[FlowRun] = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id])
            ),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=20,
        )
        refused = await self._refuse_foreign_endings(registration, runs)
        if not runs or not _may_need_action(runs, now):
            return refused
        if str(max(runs, key=lambda r: r.created or now).id) in self.settled_cancels:
            return []
        if _alive_here_only(runs, alive):
            # Every run that could be an orphan is executed by a process of this runner:
            # none is (orphan_reason), none is Cancelling, and one is active, so nothing
            # below would act. Its spec and provenance stay closed: a sweep every few
            # seconds does not open them for every running campaign.
            return []
        name, store = campaign_store(registration.parameters)
        done = []
        try:
            lease = store.lease(name)
            for run in runs:
                left_open = cancel_left_open(run, lease, self.settings, now, alive)
                if left_open is not None:
                    # A person's cancel that nobody stopped: end it as they asked (the
                    # ending is recorded below, as any person's cancel is).
                    message = f"{CANCEL_ENDED}: {left_open}"
                    await client.set_flow_run_state(run.id, Cancelled(message=message), force=True)
                    done.append(f"cancelled {run.id}: {left_open}")
                reason = orphan_reason(run, lease, self.settings, now, alive)
                if reason is not None:
                    await client.set_flow_run_state(
                        run.id, Crashed(message=f"orphaned: {reason}"), force=True
                    )
                    store.record_event(
                        name, "orphan_crashed", flow_run_id=str(run.id), details={"why": reason}
                    )
                    done.append(f"crashed {run.id}: {reason}")
                if left_open is None and reason is None:
                    continue
                runs = await client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id])
                    ),
                    sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                    limit=20,
                )
            if any(r.state is not None and r.state.type in ACTIVE for r in runs):
                return done
            # Runs made with other parameters (by anyone holding the secret) are refused,
            # never continued, and never hide the owner's own run from recovery.
            runs = [r for r in runs if dict(r.parameters) == registration.parameters]
            if not runs:
                return done
            newest = max(runs, key=lambda r: r.created or now)
            done += refused
            if cancelled_by_a_person(newest, store, name):
                # `unattended cancel`, the UI's Cancel, the API: never continued, and recorded.
                if record_cancelled(
                    store,
                    name,
                    flow_run_id=str(newest.id),
                    actor=None,
                    how="prefect",
                    params=registration.parameters,
                ):
                    done.append(f"recorded {name} as cancelled (run {newest.id})")
                else:  # recorded by whoever cancelled it: the decision is still said, once
                    done.append(
                        f"left {name} cancelled (run {newest.id}): a person's cancel is "
                        "never continued"
                    )
                self.settled_cancels.add(str(newest.id))
                return done
            why = continuation_reason(newest)
            status, code = _status(store, name)
            resumable = status in CONTINUABLE_STATUSES or (
                status == "failed" and code == TRANSIENT_CODE
            )
            if why is None or not resumable:
                if why is not None and str(newest.id) not in self.left_stopped:
                    # Said once a run: the record that a sweep judged it and did not continue.
                    self.left_stopped.add(str(newest.id))
                    done.append(
                        f"left {name} {status} ({code}) after run {newest.id}: not continued"
                    )
                return done
            tally = self._counted_so_far(store, name) if counted(newest) else None
            if tally is not None and tally.exhausted:
                done.append(stop_exhausted(store, registration.parameters, name, newest, tally))
                return done
            not_before = tally.not_before(self.settings) if tally is not None else None
            if not_before is not None and now < not_before:
                return done
            from prefect.deployments import run_deployment

            started: FlowRun = await run_deployment(  # type: ignore[misc]
                deployment.id,
                timeout=0,
                parameters=registration.parameters,
                tags=list(deployment.tags or []),
            )
            try:
                store.record_event(
                    name,
                    "continued",
                    flow_run_id=str(started.id),
                    details={
                        "after": str(newest.id),
                        "why": why,
                        "counted": tally is not None,
                        "progress": _mark(tally.progress) if tally is not None else None,
                        "cap": self.settings.max_continuations,
                    },
                )
            except UnattendedError:
                if tally is not None:
                    self.unrecorded[name] = replace(
                        tally, count=tally.count + 1, last_at=datetime.now(UTC)
                    )
                raise
            done.append(f"continued {name} as {started.id}: {why}")
        finally:
            store.close()
        return done

    async def _refuse_foreign_endings(
        self, registration: Registration, runs: list[FlowRun]
    ) -> list[str]:
        """Record, once each, crashed runs whose parameters are not the registration's.

        The flow refuses such a run itself (``run_refused``); a run with parameters the
        flow does not even take fails in Prefect's argument binding before the flow
        can, and ends Crashed: it is recorded here the same way, and never continued.
        """
        expected = registration.parameters
        foreign = [
            r
            for r in runs
            if r.state is not None
            and r.state.type == StateType.CRASHED
            and dict(r.parameters) != expected
            and str(r.id) not in self.refused_runs
        ]
        if not foreign:
            return []
        name, store = campaign_store(expected)
        done = []
        try:
            known = {e["flow_run_id"] for e in store.events(name, "run_refused")}
            for run in foreign:
                self.refused_runs.add(str(run.id))
                if str(run.id) in known:
                    continue
                params = dict(run.parameters)
                fields = sorted(
                    k for k in set(params) | set(expected) if params.get(k) != expected.get(k)
                )
                store.record_event(
                    name,
                    "run_refused",
                    flow_run_id=str(run.id),
                    details={"fields": fields, "deployment_id": registration.deployment_id},
                )
                done.append(
                    f"refused {run.id}: its parameters ({', '.join(fields)}) are not {name}'s"
                )
        finally:
            store.close()
        return done

    @property
    def home(self) -> Path:
        """Return the state directory whose registered campaigns this watchdog recovers."""
        return self.state_dir or state_dir_from(None, os.environ)

    def _counted_so_far(self, store: ProvenanceStore, name: str) -> Continuations:
        """Return the recorded continuations, or more: this runner's unrecorded ones, if any."""
        recorded = continuations(store, name, self.settings.max_continuations)
        extra = self.unrecorded.get(name)
        if extra is None or extra.progress != recorded.progress or extra.count <= recorded.count:
            return recorded
        return extra


def stop_exhausted(
    store: ProvenanceStore,
    params: dict[str, Any],
    name: str,
    newest: FlowRun,
    tally: Continuations,
) -> str:
    """Record the campaign as stopped by the continuation cap, tell people; return what was done.

    The status is written before the event: a runner that dies between the two
    leaves a campaign that is no longer continued, never one continued again.
    """
    checkpoint = store.load_checkpoint(name)
    last = checkpoint.last_completed_round
    index = 0 if last is None else last + 1
    store.set_campaign_status(name, "failed", EXHAUSTED_CODE, round_index=index)
    why = continuation_reason(newest)
    store.record_event(
        name,
        EXHAUSTED_CODE,
        flow_run_id=str(newest.id),
        details={
            "continuations": tally.count,
            "cap": tally.cap,
            "why": why,
            "progress": _mark(tally.progress),
        },
    )
    notify_stopped(params, name, index, status="failed", code=EXHAUSTED_CODE)
    message = (
        f"stopped {name} ({EXHAUSTED_CODE}): {tally.count} continuations without progress, "
        f"the last because {why}"
    )
    _log.warning("watchdog: %s", message)
    return message


def recovery_note_of(
    flow_run_id: UUID, *, runner_alive: bool, runner_pid: int | None = None
) -> str | None:
    """Return ``recovery_note`` for the run ``flow_run_id`` (read through Prefect's client).

    ``runner_pid`` is the runner serving this state directory: the runs its processes
    execute are alive, as its watchdog sees them.
    """

    async def read() -> FlowRun:
        async with get_client() as client:
            return await client.read_flow_run(flow_run_id)

    alive = flow_runs_alive_here(runner_pid) if runner_alive and runner_pid else set()
    return recovery_note(asyncio.run(read()), runner_alive=runner_alive, alive=alive)


def recovery_note(
    flow_run: FlowRun, *, runner_alive: bool, alive: frozenset[str] | set[str] = frozenset()
) -> str | None:
    """Say whether the system is about to recover ``flow_run``'s campaign, when and why.

    Only what the watchdog will do is said: it judges the run with the same rules
    (``orphan_reason``, ``continuation_reason``) and the same runs alive (``alive``).
    A run whose parameters are not its campaign's registration is never continued,
    and its campaign is opened from the registration, never from the run.
    """
    settings = RecoverySettings.from_env(os.environ)
    now = datetime.now(UTC)
    registered = registered_parameters(flow_run.deployment_id, os.environ)
    if registered is not None and dict(flow_run.parameters) != registered:
        return None  # refused by the flow and the watchdog, never continued
    try:
        name, store = campaign_store(flow_run)
    except (UnattendedError, OSError, KeyError):
        return None
    try:
        lease = store.lease(name)
        reason = orphan_reason(flow_run, lease, settings, now, alive)
        left_open = cancel_left_open(flow_run, lease, settings, now, alive)
        due_in = orphan_in(flow_run, lease, settings, now, alive)
        status, code = _status(store, name)
        # The cap the runner counts against (its setting), as it recorded it.
        cap, stopped_after = recorded_cap(store, name)
        tally = continuations(store, name, cap or settings.max_continuations)
    finally:
        store.close()
    if status == "failed" and code == EXHAUSTED_CODE:
        return (
            f"stopped ({EXHAUSTED_CODE}): continued {stopped_after or tally.cap} times "
            "without progress; fix the cause, then 'unattended submit' continues it"
        )
    if _state_type(flow_run) == StateType.CANCELLING:
        return _cancelling_note(left_open, runner_alive=runner_alive, settings=settings)
    who = _who_continues(tally if reason is not None or counted(flow_run) else None, settings)
    if not runner_alive:
        who = "no runner is serving: 'unattended serve --detach' continues it"
    if reason is not None:
        return f"orphaned: {reason}; {who}"
    # A live run takes the lease as it starts and renews it every heartbeat: one that
    # holds none for longer is forced into its state, or still starting on a slow day
    # (this process cannot see which run a forked child of the runner executes).
    lease_less = settings.lease_ttl_seconds - (due_in or 0.0)
    if due_in is not None and runner_alive and lease_less > settings.heartbeat_seconds:
        return (
            f"holds no lease after {lease_less:.0f} s: unless a process of the runner is "
            "still starting it, it was forced into its state (through the API) and the "
            f"runner ends it as orphaned in {due_in:.0f} s, then continues the campaign"
        )
    why = continuation_reason(flow_run)
    resumable = status in CONTINUABLE_STATUSES or (status == "failed" and code == TRANSIENT_CODE)
    if why is not None and resumable:
        return f"interrupted: {why}; {who}"
    return None


def _cancelling_note(
    left_open: str | None, *, runner_alive: bool, settings: RecoverySettings
) -> str | None:
    """Say who ends a Cancelling run, and when (``cancel_left_open``)."""
    if not runner_alive:
        return (
            "cancel asked; no runner is serving to stop it: 'unattended serve --detach' "
            "ends it as cancelled, and so does 'unattended cancel NAME'"
        )
    if left_open is not None:
        return (
            f"cancel asked and nobody is left to stop it ({left_open}): the runner ends "
            f"it as cancelled within {settings.watchdog_seconds:g} s"
        )
    return None  # the runner is stopping it


def _who_continues(tally: Continuations | None, settings: RecoverySettings) -> str:
    """Say when the runner continues a campaign, its cap and backoff counted."""
    if tally is not None and tally.exhausted:
        return (
            f"continued {tally.count} times without progress: the runner stops it "
            f"({EXHAUSTED_CODE}) instead of continuing it"
        )
    within = settings.watchdog_seconds
    not_before = tally.not_before(settings) if tally is not None else None
    if not_before is not None:
        within = max(within, (not_before - datetime.now(UTC)).total_seconds())
    count = f" (continuation {tally.count + 1} of {tally.cap})" if tally else ""
    return f"the runner continues it within {within:.0f} s{count}"
