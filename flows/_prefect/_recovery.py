"""Crashed runs come back by themselves: the runner's watchdog finds and continues them.

Every ``watchdog_seconds`` the runner (``CampaignService``) looks at each campaign
deployment it registered and carries out the campaign's recovery plan
(``flows._prefect._recovery_plan.plan``: the rules, with no I/O): it marks orphans
*Crashed* (which also frees the deployment's concurrency slot; an ``orphan_crashed``
event records why), sets the state of a run that recorded its ending but whose
process died before Prefect heard of it, ends a *Cancelling* run nobody is left to
stop, records a person's cancel, and continues a campaign whose newest run ended
without finishing it (a ``continued`` event records why). The new run reads the
checkpoint and goes on; one that waits for an approval waits on the same request.

Continuations after a crash or a failure are the campaign's, counted in its
provenance (``continued`` events marked ``counted``, with the campaign's progress
when they were made), so the cap and the backoff hold across runner restarts: at
most ``max_continuations`` (a setting, ``UNATTENDED_MAX_CONTINUATIONS``, default
``MAX_CONTINUATIONS``) in a row without progress (a round completed or a task
result recorded), the k-th waiting ``watchdog_seconds * 2**(k-2)`` after the one
before. The next one is refused: the campaign is recorded ``failed`` with
``continuations_exhausted`` (event of the same kind) and its notice is sent.
A run cancelled by a runner's own shutdown is an operator's act and is not counted.

What the plan is given (the runs, the campaign's record, the continuations so far) is
read in ``flows._prefect._recovery_reads``, the same way for the watchdog and for
``flows._prefect._recovery_note``, which gives ``unattended status`` the plan in words.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelled, Crashed

from flows._engine._fencing import RecoverySettings
from flows._engine._registration import (
    Registration,
    registrations,
)
from flows._paths import state_dir_from
from flows._prefect import _recovery_reads as reads
from flows._prefect._endings import (
    deployment_runs,
    notify_stopped,
    record_cancelled,
    state_for_ending,
)
from flows._prefect._recovery_plan import (
    EXHAUSTED_CODE,
    Action,
    Continuations,
    Continue,
    CrashOrphan,
    EndCancel,
    Leave,
    ReadRecord,
    RecordCancel,
    SeenRun,
    Settle,
    StopExhausted,
    plan,
)
from flows._provenance import ProvenanceStore
from policies import UnattendedError

__all__ = ["CANCEL_ENDED", "Watchdog", "stop_exhausted"]

# The message of a Cancelling run the watchdog ended: nobody was left to stop it.
CANCEL_ENDED = "cancelled with no process left to stop"

_log = logging.getLogger(__name__)


#: Prefect states of a run whose process may still work on it.
_EXECUTING = frozenset({"PENDING", "RUNNING", "CANCELLING"})


def _signature(runs: list[SeenRun]) -> tuple[tuple[str, str, datetime], ...]:
    return tuple(sorted((r.id, r.state, r.since) for r in runs))


@dataclass
class Watchdog:
    """What the runner's watchdog remembers between sweeps (continuations are in the provenance)."""

    settings: RecoverySettings
    state_dir: Path | None = None
    # Continuations whose ``continued`` event could not be written (a full disk):
    # counted here too, by campaign, so the cap and the pause hold while storage fails.
    unrecorded: dict[str, Continuations] = field(default_factory=dict)
    # Campaigns whose plan, read with their provenance, was empty (nothing due, nothing
    # coming), with their runs' states then: not read again until a run changes.
    quiet: dict[str, tuple[tuple[str, str, datetime], ...]] = field(default_factory=dict)
    # Runs of another's making whose refusal is recorded already.
    refused_runs: set[str] = field(default_factory=set)
    # Ended runs after which a campaign was left as it is, said already (``Leave``).
    left: set[str] = field(default_factory=set)
    # Held while one campaign is judged; a submission takes it too (CampaignService).
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def sweep(self, *, now: datetime | None = None) -> list[str]:
        """Carry out every campaign's due recovery actions; return what was done."""
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
        alive = reads.flow_runs_alive_here()
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
        flow_runs = await deployment_runs(client, deployment.id)
        refused = await self._refuse_foreign_endings(registration, flow_runs)
        if not flow_runs:
            return refused
        runs = [reads.seen_run(r, registration.parameters, alive, now) for r in flow_runs]
        actions = plan(runs, None, now, self.settings)
        if not any(isinstance(a, ReadRecord) for a in actions):
            # Prefect's states alone decided: a run of this runner is active, or one
            # waits for an approval; the spec and provenance stay closed.
            return refused
        key = str(deployment.id)
        if self.quiet.get(key) == _signature(runs):
            return refused
        name, store = reads.campaign_store(registration.parameters)
        try:
            record = reads.read_record(store, name, self._counted_so_far(store, name))
            actions = plan(runs, record, now, self.settings)
            # A campaign left as it is is said so once a run; then it is quiet.
            fresh = [a for a in actions if not (isinstance(a, Leave) and a.after in self.left)]
            if not fresh:
                # A run that executes elsewhere (a runner that died, another host) can give
                # its lease back, or die, with no change of its Prefect state: read again.
                if not any(r.state in _EXECUTING and not r.alive_here for r in runs):
                    self.quiet[key] = _signature(runs)
                return refused
            self.quiet.pop(key, None)
            done = []
            for action in (a for a in fresh if a.at <= now):
                said = await self._carry_out(client, deployment, registration, store, name, action)
                if said:
                    done.append(said)
        finally:
            store.close()
        return refused + done

    async def _carry_out(
        self,
        client: Any,
        deployment: Any,
        registration: Registration,
        store: ProvenanceStore,
        name: str,
        action: Action,
    ) -> str | None:
        """Do one due action of the plan; return what was done, in words."""
        match action:
            case ReadRecord():
                return None
            case CrashOrphan(run_id=run_id, why=why):
                await client.set_flow_run_state(
                    UUID(run_id), Crashed(message=f"orphaned: {why}"), force=True
                )
                store.record_event(name, "orphan_crashed", flow_run_id=run_id, details={"why": why})
                return f"crashed {run_id}: {why}"
            case Settle(run_id=run_id, ending=ending):
                await client.set_flow_run_state(
                    UUID(run_id), state_for_ending(ending.status, ending.code), force=True
                )
                store.record_event(
                    name,
                    "run_settled",
                    flow_run_id=run_id,
                    details={"status": ending.status, "code": ending.code},
                )
                return f"settled {run_id} as {ending.status} from its recorded ending"
            case EndCancel(run_id=run_id, why=why):
                # A person's cancel that nobody stopped: end it as they asked (the ending
                # is recorded by the plan's RecordCancel, as any person's cancel is).
                message = f"{CANCEL_ENDED}: {why}"
                await client.set_flow_run_state(
                    UUID(run_id), Cancelled(message=message), force=True
                )
                return f"cancelled {run_id}: {why}"
            case RecordCancel(run_id=run_id):
                # `unattended cancel`, the UI's Cancel, the API: never continued, and recorded.
                recorded = record_cancelled(
                    store,
                    name,
                    flow_run_id=run_id,
                    actor=None,
                    how="prefect",
                    params=registration.parameters,
                )
                return f"recorded {name} as cancelled (run {run_id})" if recorded else None
            case Leave(after=after, cancelled=True):
                self.left.add(after)
                return f"left {name} cancelled (run {after}): a person's cancel is never continued"
            case Leave(after=after, status=status, code=code):
                self.left.add(after)
                return f"left {name} {status} ({code}) after run {after}: not continued"
            case StopExhausted():
                tally = self._counted_so_far(store, name)
                return stop_exhausted(store, registration.parameters, name, action, tally)
            case Continue():
                return await self._continue(deployment, registration, store, name, action)

    async def _continue(
        self,
        deployment: Any,
        registration: Registration,
        store: ProvenanceStore,
        name: str,
        action: Continue,
    ) -> str:
        from prefect.deployments import run_deployment

        tally = self._counted_so_far(store, name) if action.counted else None
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
                    "after": action.after,
                    "why": action.why,
                    "counted": action.counted,
                    "progress": list(tally.progress) if tally is not None else None,
                    "cap": self.settings.max_continuations,
                },
            )
        except UnattendedError:
            if tally is not None:
                self.unrecorded[name] = replace(
                    tally, count=tally.count + 1, last_at=datetime.now(UTC)
                )
            raise
        return f"continued {name} as {started.id}: {action.why}"

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
            and r.state.type.value == "CRASHED"
            and dict(r.parameters) != expected
            and str(r.id) not in self.refused_runs
        ]
        if not foreign:
            return []
        name, store = reads.campaign_store(expected)
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
        recorded = reads.continuations(store, name, self.settings.max_continuations)
        extra = self.unrecorded.get(name)
        if extra is None or extra.progress != recorded.progress or extra.count <= recorded.count:
            return recorded
        return extra


def stop_exhausted(
    store: ProvenanceStore,
    params: dict[str, Any],
    name: str,
    action: StopExhausted,
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
    store.record_event(
        name,
        EXHAUSTED_CODE,
        flow_run_id=action.after,
        details={
            "continuations": tally.count,
            "cap": tally.cap,
            "why": action.why,
            "progress": list(tally.progress),
        },
    )
    notify_stopped(params, name, index, status="failed", code=EXHAUSTED_CODE)
    message = (
        f"stopped {name} ({EXHAUSTED_CODE}): {tally.count} continuations without progress, "
        f"the last because {action.why}"
    )
    _log.warning("watchdog: %s", message)
    return message
