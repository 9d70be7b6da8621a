"""One live run per campaign: which run of a campaign's deployment may wait for its answers.

Anyone holding the owner's credential can create a second run of a campaign's
deployment (with identical parameters, so the registration check passes). Such a
clone replays the campaign to the same waiting request and, before this rule,
suspended on it beside the real run: answers went to either, a refusal on one
moved the other's form. The rule, read from Prefect alone, the same in the flow
(before it suspends) and in the server (before an approver's resume):

    **the campaign's current run is the oldest run of its deployment that has not ended.**

The run the owner submitted is older than any clone made while it lives; the runner's
continuation of a crashed (or forced-ended) run is made after that run ended, so it is
the oldest still going. A run that is not current never suspends: it ends Cancelled,
recorded as a ``clone_refused`` event in the campaign's provenance, its message
that of a fenced-out run (``fenced out: ...``), so no watchdog takes it for a person's cancel.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from prefect.client.schemas.objects import State

# Prefect's state types of a run that has ended (it will never answer again).
ENDED: Final = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})
_log = logging.getLogger("unattended.campaign")


def current_run(runs: Iterable[tuple[datetime, str, str]]) -> str | None:
    """Return the id of the current run among ``(created, id, state type)``, or None.

    Ties in creation time go to the smaller id, so every reader picks the same run.
    """
    going = sorted((created, run_id) for created, run_id, state in runs if state not in ENDED)
    return going[0][1] if going else None


async def clone_of(flow_run_id: str, deployment_id: str) -> str | None:
    """Return the current run's id when ``flow_run_id`` is not it (None when it is).

    Reads the deployment's runs that have not ended through the Prefect API (the
    flow-run process holds the owner's credential).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    ended = [StateType(state) for state in sorted(ENDED)]
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]),  # type: ignore[list-item]
                state=FlowRunFilterState(type=FlowRunFilterStateType(not_any_=ended)),
            ),
            limit=200,
        )
    current = current_run(
        (run.created, str(run.id), run.state.type.value if run.state else "SCHEDULED")
        for run in runs
        if run.created is not None
    )
    return current if current is not None and current != flow_run_id else None


async def refuse_clone() -> State[Any] | None:
    """Refuse this flow run when it is not its campaign's current run; None when it is.

    Called at the top of the flow, after the registration check (``_refusal``), before
    anything is loaded: a clone never reaches the campaign's request, so it never waits
    on it and no answer is ever given to it. The refusal is recorded (``clone_refused``)
    in the campaign's provenance, and the run ends Cancelled.
    """
    from prefect import get_run_logger
    from prefect.context import FlowRunContext
    from prefect.states import Cancelled

    context = FlowRunContext.get()
    flow_run = context.flow_run if context else None
    if flow_run is None or flow_run.deployment_id is None:
        return None
    flow_run_id, deployment_id = str(flow_run.id), str(flow_run.deployment_id)
    current = await clone_of(flow_run_id, deployment_id)
    if current is None:
        return None
    message = (
        f"flow run {flow_run_id} is not its campaign's current run ({current} is): one live "
        "run per campaign (rule one_live_run_per_campaign); nothing was loaded or run"
    )
    get_run_logger().error("run refused (clone_refused): %s", message)
    _record_clone(deployment_id, flow_run_id, current)
    # Its recorded ending (failed, clone_refused) tells the runner's watchdog it is no
    # person's cancel; the message is for people.
    return Cancelled(message=f"fenced out: {message} (clone_refused)")


def _record_clone(deployment_id: str, flow_run_id: str, current: str) -> None:
    """Record the refused clone in its campaign's provenance (best effort: the refusal stands)."""
    from flows._engine._registration import registration_for
    from flows._paths import state_dir_from
    from flows._prefect._pending import provenance_location
    from flows._provenance import ProvenanceStore

    registration = registration_for(state_dir_from(None, os.environ), deployment_id)
    if registration is None:
        return
    try:
        _, location = provenance_location(registration.parameters, os.environ)
        store = ProvenanceStore.open(location)
    except Exception:  # noqa: BLE001  # the refusal stands; the run's log says it
        _log.warning("could not record the refused clone in %s's provenance", registration.campaign)
        return
    try:
        store.record_event(
            registration.campaign,
            "clone_refused",
            flow_run_id=flow_run_id,
            details={"current": current, "rule": "one_live_run_per_campaign"},
        )
        store.record_run_ending(registration.campaign, flow_run_id, "failed", "clone_refused")
    finally:
        store.close()
