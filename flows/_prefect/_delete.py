"""Delete a campaign: its Prefect deployment and flow runs, its registration, maybe its record.

``unattended delete NAME`` works in two steps, so the command can ask before
anything is removed:

* :func:`plan_delete` finds the campaign through the owner's registration (never a
  deployment's parameters), its deployment's flow runs and where its provenance
  is. It removes nothing.
* :func:`delete_campaign` removes the flow runs, then the deployment, through
  Prefect's API, then the registration file (so the runner no longer serves it
  and its watchdog no longer continues it). The provenance is kept and a
  ``deleted`` event is recorded in it; with ``purge`` the campaign's rows are
  deleted in one transaction instead and its folder under the state directory
  (journals, telemetry, work folders, its SQLite file) is removed.

A campaign with an active run (scheduled, pending, running, suspended for an
approval, or cancelling) is refused before anything is removed: ``unattended
cancel NAME`` stops it first, and records how it ended.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound

from flows._engine._registration import Registration, registration_path
from flows._paths import campaign_dir, state_dir_from
from flows._prefect._endings import registration_of, still_active
from flows._provenance import ProvenanceStore
from flows._provenance._engines import resolve
from policies import NotFound, UnattendedError, ValidationFailed
from tasks import load_site

DELETED_EVENT = "deleted"
_PAGE = 200


@dataclass
class DeletePlan:
    """What deleting campaign ``name`` would remove, found without removing anything."""

    name: str
    state_dir: Path
    registration: Registration
    runs: list[str] = field(default_factory=list)
    # Where the record is, to open it (a URL may hold a password: never printed) ...
    record_location: str | None = None
    # ... and as it is shown (a path, or a URL without its password); None: unknown, and why.
    provenance: str | None = None
    provenance_problem: str = ""


@dataclass
class DeleteOutcome:
    """What :func:`delete_campaign` removed."""

    runs_deleted: int = 0
    deployment_deleted: bool = False
    rows_purged: int | None = None  # None: the provenance was kept
    event_recorded: bool = False
    folder_removed: Path | None = None


async def _deployment_runs(client: Any, deployment_id: UUID) -> list[FlowRun]:
    """Return every flow run of the deployment (read page by page), newest first."""
    found: list[FlowRun] = []
    while True:
        page: list[FlowRun] = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id])
            ),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=_PAGE,
            offset=len(found),
        )
        found.extend(page)
        if len(page) < _PAGE:
            return found


async def plan_delete(name: str, *, purge: bool) -> DeletePlan:
    """Find campaign ``name``'s deployment, flow runs and provenance; remove nothing.

    The provenance is found from the registration's site and state directory, not
    from the spec, which may be gone: a campaign whose spec was removed can still be
    deleted. A site that cannot be read leaves the provenance unknown: it is then
    left as it is, and ``purge`` is refused.

    Raises:
        NotFound: no campaign of that name was submitted from this state directory.
        ValidationFailed: a run of the campaign is not over, or ``purge`` was asked
            and the provenance cannot be found.
    """
    home, registration = registration_of(name)
    plan = DeletePlan(name, home, registration)
    async with get_client() as client:
        runs = await _deployment_runs(client, UUID(registration.deployment_id))
    active = still_active(runs)
    if active:
        shown = ", ".join(f"{r.id} ({r.state.name if r.state else '?'})" for r in active)
        raise ValidationFailed(
            f"campaign {name!r} has an active run: {shown}; nothing was deleted. Stop it "
            f"first with 'unattended cancel {name}', then delete it",
            details={"campaign": name, "runs": [str(r.id) for r in active]},
        )
    plan.runs = [str(r.id) for r in runs]
    try:
        plan.record_location = _record_location(registration)
        plan.provenance = resolve(plan.record_location).label
    except (UnattendedError, OSError) as exc:
        plan.record_location = plan.provenance = None
        plan.provenance_problem = exc.message if isinstance(exc, UnattendedError) else str(exc)
    if purge and plan.record_location is None:
        raise ValidationFailed(
            f"cannot purge campaign {name!r}: its provenance cannot be found "
            f"({plan.provenance_problem}); nothing was deleted. Without --purge the campaign "
            "is deleted and its provenance left as it is",
            details={"campaign": name, "field": "site", "file": registration.site},
        )
    return plan


def _record_location(registration: Registration) -> str:
    """Return where the campaign's flow writes its record: the site's URL, else its folder."""
    site = load_site(registration.site, env=os.environ)
    if site.provenance_url is not None:
        return site.provenance_url.get_secret_value()
    home = state_dir_from(registration.state_dir, os.environ)
    return str(campaign_dir(home, registration.campaign))


async def delete_campaign(plan: DeletePlan, *, purge: bool, actor: str) -> DeleteOutcome:
    """Remove what ``plan`` found (see the module doc); return what was removed.

    The runs go first, then the deployment, then the registration: a step that
    fails leaves the campaign registered, and ``delete`` can be run again.
    """
    outcome = DeleteOutcome()
    deployment_id = UUID(plan.registration.deployment_id)
    async with get_client() as client:
        # Read again: a run started since the plan (a resubmission) is not removed unseen.
        runs = await _deployment_runs(client, deployment_id)
        active = still_active(runs)
        if active:
            raise ValidationFailed(
                f"campaign {plan.name!r} got an active run ({active[0].id}) meanwhile; nothing "
                f"was deleted. Stop it with 'unattended cancel {plan.name}' first",
                details={"campaign": plan.name, "runs": [str(r.id) for r in active]},
            )
        for run in runs:
            try:
                await client.delete_flow_run(run.id)
                outcome.runs_deleted += 1
            except ObjectNotFound:
                pass  # gone already (deleted from the UI meanwhile)
        try:
            await client.delete_deployment(deployment_id)
            outcome.deployment_deleted = True
        except ObjectNotFound:
            pass
    store = _open_record(plan)
    if purge:
        outcome.rows_purged = 0
    if store is not None:
        try:
            if purge:
                from flows._provenance._purge import purge_campaign

                outcome.rows_purged = purge_campaign(store, plan.name)
            else:
                outcome.event_recorded = _record_deleted(store, plan, outcome, actor)
        finally:
            store.close()
    registration_path(plan.state_dir, plan.name).unlink(missing_ok=True)
    if purge:
        folder = campaign_dir(plan.state_dir, plan.name)
        if folder.is_dir():
            shutil.rmtree(folder)
            outcome.folder_removed = folder
    return outcome


def _open_record(plan: DeletePlan) -> ProvenanceStore | None:
    """Open the campaign's provenance store; None when it is unknown or its file is gone."""
    if plan.record_location is None:
        return None
    location = resolve(plan.record_location)
    if location.path is not None and not location.path.exists():
        return None  # removed by hand: opening it would make an empty one
    return ProvenanceStore.open(plan.record_location)


def _record_deleted(
    store: ProvenanceStore, plan: DeletePlan, outcome: DeleteOutcome, actor: str
) -> bool:
    """Record a ``deleted`` event; False when the campaign has no record (it never ran)."""
    try:
        store.record_event(
            plan.name,
            DELETED_EVENT,
            actor=actor,
            details={
                "deployment": plan.registration.deployment_name,
                "deployment_id": plan.registration.deployment_id,
                "flow_runs_deleted": outcome.runs_deleted,
            },
        )
    except NotFound:
        return False
    return True
