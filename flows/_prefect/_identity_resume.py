"""An approver's resume, checked in the server: the current waiting run, a rule naming them.

``flows._prefect._identity`` calls this for ``POST /api/flow_runs/{id}/resume`` sent
with an approver's login. The run must be suspended, be its campaign's current run
(``flows._prefect._current_run``), belong to a campaign registered by the server's
owner (the registration file, private to the owner, names its deployment and
parameters: ``judge_run``), and wait on a request whose rule lists the approver. The
answer's ``approver`` must be the login's name (it is filled in when absent): an
answer naming someone else is refused and recorded as an ``answer_refused`` event in
the campaign's provenance, so the owner sees the attempt.

Every answer that passes the server (the owner's too) carries ``authenticated_as``,
written here and nowhere else (a client's own is dropped): ``approver:NAME`` or
``owner``. The flow records the answer as that identity (``flows._engine._approval``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

from flows._prefect._current_run import ENDED, current_run

# The field of a stored answer only the server writes (the form's schema admits it by
# patternProperties, so the UI never renders it: flows._prefect._approval_form).
STAMP: Final = "authenticated_as"
OWNER: Final = "owner"
_log = logging.getLogger("prefect.server.unattended")


def stamped(run_input: dict[str, Any], identity: str) -> dict[str, Any]:
    """Return ``run_input`` with the server's identity stamp (a client's own is replaced)."""
    return {**{k: v for k, v in run_input.items() if k != STAMP}, STAMP: identity}


@dataclass(frozen=True)
class Refused:
    """Why an approver may not resume a run: the message names the rule, never a secret."""

    message: str
    rule: str = "approver_resume"


async def check_resume(flow_run_id: UUID, name: str, run_input: Any) -> Refused | None:
    """Return why approver ``name`` may not resume ``flow_run_id`` with ``run_input``, or None."""
    run = await _read_run(flow_run_id)
    if run is None:
        return Refused(f"no flow run {flow_run_id}", "approver_resume_unknown_run")
    state_type, pause_key, deployment_id, parameters, current = run
    if state_type != "PAUSED" or not pause_key:
        return Refused(
            f"flow run {flow_run_id} waits for no answer (state {state_type})",
            "approver_resume_not_waiting",
        )
    if current != str(flow_run_id):
        return Refused(
            f"flow run {flow_run_id} is not its campaign's current run ({current}); "
            "an answer counts only on the current run",
            "one_live_run_per_campaign",
        )
    return await asyncio.to_thread(
        _check_request, flow_run_id, name, run_input, deployment_id, parameters, pause_key
    )


async def stamp_admitted(flow_run_id: UUID) -> bool:
    """Return whether the form ``flow_run_id`` waits with admits the server's stamp.

    A form stored by an older version (a run suspended before the upgrade) has no
    place for it: its answers go on unstamped (the flow then claims no login), rather
    than being refused by the server's schema check.
    """
    from prefect.server import models
    from prefect.server.database import provide_database_interface

    db = provide_database_interface()
    async with db.session_context() as session:
        run = await models.flow_runs.read_flow_run(  # type: ignore[attr-defined]
            session=session, flow_run_id=flow_run_id
        )
        keyset = run.state.state_details.run_input_keyset if run and run.state else None
        if not keyset or "schema" not in keyset:
            return False
        stored = await models.flow_run_input.read_flow_run_input(  # type: ignore[attr-defined]
            session=session, flow_run_id=flow_run_id, key=keyset["schema"]
        )
    return stored is not None and f'"^{STAMP}$"' in stored.value


async def _read_run(
    flow_run_id: UUID,
) -> tuple[str, str, str | None, dict[str, Any], str | None] | None:
    """Return the run's state, pause key, deployment, parameters and its campaign's current run."""
    from prefect.server import models, schemas
    from prefect.server.database import provide_database_interface

    db = provide_database_interface()
    async with db.session_context() as session:
        # (Prefect's db_injector hides that these are coroutines from mypy.)
        run = await models.flow_runs.read_flow_run(  # type: ignore[attr-defined]
            session=session, flow_run_id=flow_run_id
        )
        if run is None:
            return None
        state = run.state
        state_type = state.type.value if state is not None else "?"
        pause_key = (state.state_details.pause_key if state is not None else None) or ""
        if run.deployment_id is None:
            return state_type, pause_key, None, dict(run.parameters or {}), None
        filters = schemas.filters
        going = await models.flow_runs.read_flow_runs(  # type: ignore[attr-defined]
            session=session,
            flow_run_filter=filters.FlowRunFilter(
                deployment_id=filters.FlowRunFilterDeploymentId(any_=[run.deployment_id]),
                state=filters.FlowRunFilterState(
                    type=filters.FlowRunFilterStateType(
                        not_any_=[schemas.states.StateType(s) for s in sorted(ENDED)]
                    )
                ),
            ),
            limit=200,
        )
        current = current_run(
            (r.created, str(r.id), r.state.type.value if r.state else "SCHEDULED") for r in going
        )
        return state_type, pause_key, str(run.deployment_id), dict(run.parameters or {}), current


def _check_request(
    flow_run_id: UUID,
    name: str,
    run_input: Any,
    deployment_id: str | None,
    parameters: dict[str, Any],
    pause_key: str,
) -> Refused | None:
    """Check the campaign's registration and its waiting request (files and provenance)."""
    from flows._engine._registration import judge_run
    from flows._paths import state_dir_from
    from flows._prefect._pending import describe_pending

    home = state_dir_from(parameters.get("state_dir") or None, os.environ)
    registration, refusal = judge_run(home, deployment_id, parameters)
    if registration is None or refusal is not None:
        return Refused(
            f"flow run {flow_run_id} is not a campaign registered by this server's owner",
            "approver_resume_unregistered",
        )
    pending = describe_pending(registration.parameters, pause_key, os.environ)
    if pending.rule is None or name not in pending.approvers:
        allowed = ", ".join(pending.approvers) or "none"
        return Refused(
            f"approver {name!r} is not named by rule {pending.rule} of campaign "
            f"{pending.campaign} (allowed: {allowed})",
            "approver_not_named_by_rule",
        )
    typed = run_input.get("approver") if isinstance(run_input, dict) else None
    if typed is not None and typed != name:
        _record_refused(registration.parameters, pending.campaign, flow_run_id, name, pause_key)
        return Refused(
            f"logged in as {name!r}, the answer names another approver: an answer is "
            "recorded as who logged in (recorded as answer_refused)",
            "approver_is_who_logged_in",
        )
    return None


def _record_refused(
    parameters: dict[str, Any], campaign: str, flow_run_id: UUID, name: str, pause_key: str
) -> None:
    """Record an answer refused for naming another approver (what was typed is not kept)."""
    from flows._prefect._pending import provenance_location
    from flows._provenance import ProvenanceStore

    try:
        _, location = provenance_location(parameters, os.environ)
        store = ProvenanceStore.open(location)
    except Exception:  # noqa: BLE001  # the refusal stands; the server's log says it
        _log.warning("could not record a refused answer in campaign %s's provenance", campaign)
        return
    try:
        store.record_event(
            campaign,
            "answer_refused",
            flow_run_id=str(flow_run_id),
            actor=name,
            details={"rule": "approver_is_who_logged_in", "pause_key": pause_key},
        )
    finally:
        store.close()
