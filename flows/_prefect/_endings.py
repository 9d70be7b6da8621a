"""Record how a campaign ended when its run ended outside the engine: cancels, failures.

**A failure the engine did not record** (the executor could not start, say) left the
provenance saying ``running``; the flow records it (``record_failure``) as
``failed`` with the error's stable code, so ``inspect`` tells the truth.

**Cancel.**
``unattended cancel NAME`` and Prefect's UI Cancel end the same way:

* ``cancel`` first records a ``cancel_requested`` event per active run (so the
  runner's watchdog never continues a run a person stopped, even when the run's
  last state is the one a runner's shutdown leaves), then proposes *Cancelling*.
  Prefect turns a scheduled or suspended run *Cancelled* at once (nothing runs);
  for a running one the runner kills the flow-run process and sets *Cancelled*.
* once no run is active, the campaign is recorded as stopped: status ``blocked``
  with the code ``cancelled`` (the stopped round with it) and a ``cancelled``
  event. ``inspect`` shows it as ``cancelled``.
* a cancel from the UI (or ``prefect flow-run cancel``) records no request; the
  watchdog sees the campaign's newest run *Cancelled* by something other than a
  runner's shutdown or a fence, while the provenance still says running or
  awaiting approval, and records the same ending (``record_cancelled``).

A batch in flight when its run is cancelled is not finished: the tasks that ended
keep their results, the batch stays ``launched`` and nothing relaunches it (a
cancelled campaign is not continued). Submitting the campaign again continues it
from its last completed round: the cancelled round runs again, its batch included.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.states import Cancelled, Cancelling, Completed, Failed

from flows._paths import state_dir_from
from flows._provenance import ProvenanceStore
from policies import UnattendedError, classify

if TYPE_CHECKING:
    from flows._engine._registration import Registration

_log = logging.getLogger(__name__)

CANCEL_REQUESTED = "cancel_requested"
CANCELLED_EVENT = "cancelled"
# The stable code of a campaign a person stopped (its status is ``blocked``).
CANCELLED_CODE = "cancelled"
# The message Prefect's runner puts on the runs it cancels when it stops: Prefect's own
# words, the one state message read back (it marks those runs in no other way).
SHUTDOWN_MESSAGE = "Runner is shutting down."
# The code of a campaign an approver stopped by rejecting its request.
REJECTED_CODE = "approval_rejected"
STILL_GOING = frozenset({"running", "awaiting_approval"})
# The run state types of a run that is not over (a cancel stops them; a delete refuses them).
ACTIVE_TYPES = {
    StateType.SCHEDULED,
    StateType.PENDING,
    StateType.RUNNING,
    StateType.PAUSED,
    StateType.CANCELLING,
}


@dataclass
class CancelOutcome:
    """What ``cancel_campaign`` did."""

    name: str
    runs: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)
    recorded: bool = False
    status: str | None = None
    error_code: str | None = None
    # Batches launched and not finished when the cancel came (none while awaiting approval).
    in_flight: int = 0


def campaign_status(store: ProvenanceStore, name: str) -> tuple[str | None, str | None]:
    """Return the campaign's recorded status and error code (None, None: unknown)."""
    found = next((c for c in store.campaigns() if c["name"] == name), None)
    return (found["status"], found["error_code"]) if found else (None, None)


def cancel_was_requested(store: ProvenanceStore, name: str, flow_run_id: str) -> bool:
    """Return whether ``unattended cancel`` asked to cancel this run."""
    return any(
        e.get("flow_run_id") == flow_run_id for e in store.events(name, kind=CANCEL_REQUESTED)
    )


def record_cancelled(
    store: ProvenanceStore,
    name: str,
    *,
    flow_run_id: str | None,
    actor: str | None,
    how: str,
    params: dict[str, Any] | None = None,
) -> bool:
    """Record the campaign as cancelled unless it already ended; return whether it was.

    Without ``actor``, the person who asked with ``unattended cancel`` for this run
    (its ``cancel_requested`` event) is recorded: the runner's watchdog may see the
    run end before the command does. With the campaign's registered ``params`` its
    ``[notify]`` people are told (the ``blocked`` notice, code ``cancelled``).
    """
    status, _code = campaign_status(store, name)
    if status not in STILL_GOING:
        return False
    if actor is None and flow_run_id is not None:
        asked = [
            e for e in store.events(name, kind=CANCEL_REQUESTED) if e["flow_run_id"] == flow_run_id
        ]
        if asked:
            actor, how = asked[-1]["actor"], "unattended cancel"
    rounds = store.load_checkpoint(name).rounds
    open_round = next((i for i, s in sorted(rounds.items()) if s in STILL_GOING), None)
    if flow_run_id is not None and not store.record_run_ending(
        name, flow_run_id, "blocked", CANCELLED_CODE
    ):
        # Recorded first, as the claim: the CLI's cancel and the watchdog may both see
        # this run cancelled; whoever recorded its ending records the campaign's (its
        # status write follows at once: the caller reads the status after this returns).
        deadline = time.monotonic() + 5.0
        while campaign_status(store, name)[0] in STILL_GOING and time.monotonic() < deadline:
            time.sleep(0.05)
        return False
    store.set_campaign_status(name, "blocked", CANCELLED_CODE, round_index=open_round)
    store.record_event(
        name,
        CANCELLED_EVENT,
        flow_run_id=flow_run_id,
        actor=actor,
        details={"how": how, "round": open_round, "was": status},
    )
    if params is not None:
        last = store.load_checkpoint(name).last_completed_round
        upcoming = 0 if last is None else last + 1
        notify_stopped(
            params,
            name,
            upcoming if open_round is None else open_round,
            status="blocked",
            code=CANCELLED_CODE,
        )
    return True


def notify_stopped(
    params: dict[str, Any], name: str, index: int, *, status: str, code: str
) -> None:
    """Send the campaign's ``stopped`` notice, as its run would have (never raises).

    For endings decided outside the flow run: a person's cancel, the watchdog's cap.
    """
    from flows._engine._notify import Notifier
    from flows._paths import campaign_dir
    from flows._spec import load_campaign
    from tasks import load_site

    try:
        loaded = load_campaign(params["spec_path"])
        site = load_site(params.get("site") or loaded.spec.site, env=os.environ)
        config = loaded.spec.notify or site.notify
        if config is None:
            return
        journal = campaign_dir(state_dir_from(params.get("state_dir"), os.environ), name)
        Notifier(config, name, journal / "notifications.jsonl").on_event(
            "stopped", {"round": index, "status": status, "code": code}
        )
    except (UnattendedError, OSError, KeyError) as exc:
        _log.warning("%s: no %s notice (%s)", name, code, type(exc).__name__)


def record_failure(
    store: ProvenanceStore, name: str, exc: BaseException, flow_run_id: str | None = None
) -> bool:
    """Record the campaign as failed with ``exc``'s stable code if it still says running.

    The run's ending (``failed`` with that code) is recorded for ``flow_run_id`` too.
    Best effort: the run's own error is what the caller raises; a store that cannot
    take the write (a full disk) is left as it is, and the watchdog retries the run.
    """
    code = classify(exc).code
    try:
        if flow_run_id is not None:
            store.record_run_ending(name, flow_run_id, "failed", code)
        status, _code = campaign_status(store, name)
        if status != "running":
            return False
        store.set_campaign_status(name, "failed", code)
        store.record_event(name, "failed", details={"code": code, "where": "outside a round"})
    except Exception:  # noqa: BLE001  # the run's own error is the one to report
        _log.warning("could not record %s's failure (%s) in its provenance", name, code)
        return False
    return True


def state_for_ending(status: str, code: str | None, detail: str = "") -> State[Any]:
    """Return the Prefect state that shows a run's recorded ending (``run_ending``).

    Completed for a completed campaign. A rejected approval is a person's decision to
    stop, not a failure: Cancelled, the message naming who (``detail``). Anything else
    that stopped the campaign is Failed. The message is for people; nothing reads it
    back (the ending is in the provenance).
    """
    data = {"status": status, "error_code": code}
    if status == "completed":
        return Completed(message="campaign completed", data=data)
    if code == REJECTED_CODE:
        said = detail or "approval rejected"
        return Cancelled(message=f"stopped: {said} ({status}, {code})", data=data)
    said = f": {detail}" if detail else ""
    return Failed(message=f"campaign {status} ({code}){said}", data=data)


def registered_store(params: dict[str, Any]) -> tuple[str, ProvenanceStore]:
    """Open the provenance store of the campaign the owner registered with ``params``."""
    from flows._engine._direct import open_store
    from flows._spec import load_campaign
    from tasks import load_site

    loaded = load_campaign(params["spec_path"])
    site = load_site(params.get("site") or loaded.spec.site, env=os.environ)
    home = state_dir_from(params.get("state_dir"), os.environ)
    return loaded.spec.name, open_store(site, loaded, home)


async def deployment_runs(client: Any, deployment_id: Any) -> list[FlowRun]:
    """Return the newest 20 flow runs of a deployment (what the watchdog and cancel judge)."""
    runs: list[FlowRun] = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id])
        ),
        sort=FlowRunSort.EXPECTED_START_TIME_DESC,
        limit=20,
    )
    return runs


def registration_of(name: str) -> tuple[Path, Registration]:
    """Return this state directory and campaign ``name``'s registration in it.

    The owner's registration, never a deployment's parameters, says where the campaign is.

    Raises:
        NotFound: no campaign of that name was submitted from this state directory.
    """
    from flows._engine._registration import require_registration

    home = state_dir_from(None, os.environ)
    return home, require_registration(home, name)


def still_active(runs: list[FlowRun]) -> list[FlowRun]:
    """Return the runs that are not over (``ACTIVE_TYPES``)."""
    return [r for r in runs if r.state is not None and r.state.type in ACTIVE_TYPES]


async def cancel_campaign(
    name: str,
    *,
    actor: str,
    wait_seconds: float,
    runner_serves: bool,
    say: Any = print,
) -> CancelOutcome:
    """Cancel campaign ``name``'s active runs and record the ending (see the module doc).

    ``runner_serves`` says whether a runner serves this state directory: without
    one, nobody stops a running run's process, so the run is set *Cancelled* at
    once (by force) instead of waiting ``wait_seconds`` for the runner.

    Raises:
        NotFound: no campaign of that name was submitted from this state directory.
    """
    _home, registration = registration_of(name)
    deployment_id = UUID(registration.deployment_id)
    outcome = CancelOutcome(name)
    campaign, store = registered_store(registration.parameters)
    async with get_client() as client:
        try:
            active = still_active(await deployment_runs(client, deployment_id))
            outcome.in_flight = store.batches_in_flight(campaign)
            message = f"cancelled by {actor} with 'unattended cancel'"
            for run in active:
                store.record_event(campaign, CANCEL_REQUESTED, flow_run_id=str(run.id), actor=actor)
                await client.set_flow_run_state(run.id, Cancelling(message=message))
                outcome.runs.append(str(run.id))
            if active:
                say(f"asked Prefect to cancel {len(active)} run(s) of {campaign}")
            deadline = time.monotonic() + (wait_seconds if runner_serves else 0.0)
            while True:
                still = still_active(await deployment_runs(client, deployment_id))
                if not still or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(0.5)
            for run in still:
                # No runner (or none that answered in time) stops this run: end it here.
                await client.set_flow_run_state(run.id, Cancelled(message=message), force=True)
                outcome.forced.append(str(run.id))
            flow_run_id = outcome.runs[0] if outcome.runs else None
            recorded = record_cancelled(
                store,
                campaign,
                flow_run_id=flow_run_id,
                actor=actor,
                how="unattended cancel",
                params=registration.parameters,
            )
            outcome.status, outcome.error_code = campaign_status(store, campaign)
            if (outcome.status, outcome.error_code) == ("blocked", CANCELLED_CODE):
                for run_id in outcome.runs:  # each cancelled run's ending, typed
                    store.record_run_ending(campaign, run_id, "blocked", CANCELLED_CODE)
            # The runner's watchdog may have recorded this very cancel first (same request).
            outcome.recorded = recorded or bool(
                outcome.runs and (outcome.status, outcome.error_code) == ("blocked", CANCELLED_CODE)
            )
        finally:
            store.close()
    return outcome
