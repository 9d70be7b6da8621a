"""The login node's side of a campaign: submit, serve, approve, expire approvals.

``submit_campaign`` validates the spec and site, registers (or updates) the
campaign's deployment and starts a flow run. ``CampaignService`` is what
``unattended serve`` runs: a Prefect ``Runner`` that serves every campaign
deployment (it picks up deployments submitted after it started), plus a watchdog
that answers approval requests whose deadline passed, so the campaign follows its
timeout policy instead of waiting forever. ``approve_run`` goes through the same
Prefect resume API as the UI's form.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterTags,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.runner import Runner
from prefect.types.entrypoint import EntrypointType

from flows._approval import SYSTEM_TIMEOUT_APPROVER
from flows._campaign import campaign_flow
from flows._campaign_state import approval_deadline
from flows._paths import campaign_dir, state_dir_from
from flows._runner import RUNNER_QUERY_SECONDS, make_runner
from flows._spec import LoadedSpec, load_campaign
from policies import NotFound, UnattendedError
from tasks import load_site

TAG = "unattended"
ACTIVE_STATES = [
    StateType.SCHEDULED,
    StateType.PENDING,
    StateType.RUNNING,
    StateType.PAUSED,
    StateType.CANCELLING,
]


def campaign_tag(name: str) -> str:
    """Return the tag that marks a campaign's deployment and runs."""
    return f"campaign:{name}"


@dataclass(frozen=True)
class Submitted:
    """A started (or already active) campaign run."""

    campaign: str
    flow_run_id: UUID
    deployment_id: UUID
    already_active: bool


def validate_submission(
    spec_path: str | Path, site: str | None, env: Mapping[str, str]
) -> tuple[LoadedSpec, str]:
    """Validate the spec, the files it names and the site (``SpecInvalid``, ``SiteInvalid``)."""
    loaded = load_campaign(spec_path)
    site_name = site or loaded.spec.site
    load_site(site_name, env=env)
    return loaded, site_name


async def active_run(campaign: str) -> FlowRun | None:
    """Return the campaign's run that is scheduled, running or suspended, if any."""
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=ACTIVE_STATES)),
                tags={"all_": [TAG, campaign_tag(campaign)]},  # type: ignore[arg-type]
            ),
            limit=1,
        )
    return runs[0] if runs else None


async def submit_campaign(
    spec_path: str | Path,
    *,
    site: str | None = None,
    state_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Submitted:
    """Validate, register the campaign's deployment and start a run; return at once.

    A campaign that already has an active run is not started twice: that run is
    returned with ``already_active``.
    """
    environment = os.environ if env is None else env
    loaded, site_name = validate_submission(spec_path, site, environment)
    home = state_dir_from(state_dir, environment)
    name = loaded.spec.name
    existing = await active_run(name)
    if existing is not None and existing.deployment_id is not None:
        return Submitted(name, existing.id, existing.deployment_id, already_active=True)
    deployment = await campaign_flow.ato_deployment(
        name=name,
        parameters={"spec_path": str(loaded.path), "site": site_name, "state_dir": str(home)},
        tags=[TAG, campaign_tag(name)],
        description=f"unattended campaign {name} ({loaded.path})",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    # Both are sync/async dispatchers; inside a coroutine they return awaitables.
    deployment_id: UUID = await deployment.apply()  # type: ignore[misc]
    flow_run: FlowRun = await run_deployment(  # type: ignore[misc]
        deployment_id, timeout=0, tags=[TAG, campaign_tag(name)]
    )
    campaign_dir(home, name).mkdir(parents=True, exist_ok=True)
    return Submitted(name, flow_run.id, deployment_id, already_active=False)


class CampaignService:
    """The runner on the login node: serves every campaign deployment, expires approvals.

    Args:
        query_seconds: How often the runner looks for scheduled or resumed runs.
        watch_seconds: How often new deployments and approval deadlines are checked.
    """

    def __init__(
        self,
        *,
        query_seconds: float = RUNNER_QUERY_SECONDS,
        watch_seconds: float = 2.0,
        name: str | None = None,
    ) -> None:
        self.runner: Runner = make_runner(
            name=name or "unattended-login-node", query_seconds=query_seconds
        )
        self.watch_seconds = watch_seconds
        self._served: set[UUID] = set()

    async def sync_deployments(self) -> int:
        """Serve every campaign deployment not served yet; return how many were added."""
        async with get_client() as client:
            deployments = await client.read_deployments(
                deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=[TAG]))
            )
        added = 0
        for deployment in deployments:
            if deployment.id in self._served:
                continue
            await self.runner.aadd_flow(
                campaign_flow,
                name=deployment.name,
                parameters=deployment.parameters,
                tags=deployment.tags,
                description=deployment.description,
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
            self._served.add(deployment.id)
            added += 1
        return added

    async def run_once(self) -> None:
        """Serve deployments, expire approvals, run what is due now and wait for it (tests)."""
        await self.sync_deployments()
        await expire_approvals()
        await self.runner.start(run_once=True)

    async def serve(self) -> None:
        """Serve until cancelled (SIGTERM or Ctrl-C)."""
        await self.sync_deployments()

        async def watch() -> None:
            while True:
                await asyncio.sleep(self.watch_seconds)
                try:
                    await self.sync_deployments()
                    await expire_approvals()
                except Exception as exc:  # noqa: BLE001  # the watchdog must outlive a server hiccup
                    print(f"watchdog: {type(exc).__name__}; retrying", flush=True)

        watcher = asyncio.create_task(watch())
        try:
            await self.runner.start()
        finally:
            watcher.cancel()


async def suspended_runs() -> list[FlowRun]:
    """Return every campaign run waiting for an approval."""
    async with get_client() as client:
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])),
                tags={"all_": [TAG]},  # type: ignore[arg-type]
            )
        )


@dataclass(frozen=True)
class PendingApproval:
    """A suspended run's request, read from its parameters and the provenance."""

    flow_run: FlowRun
    campaign: str
    key: str
    rule: str | None
    approvers: list[str]
    requested_at: datetime | None
    deadline: datetime | None


def pending_approval(flow_run: FlowRun) -> PendingApproval:
    """Describe what ``flow_run`` waits for (reads the campaign's provenance)."""
    from flows._campaign import open_store

    params = flow_run.parameters
    loaded = load_campaign(params["spec_path"])
    site = load_site(params.get("site") or loaded.spec.site, env=os.environ)
    pause_key = (flow_run.state.state_details.pause_key if flow_run.state else None) or ""
    key = pause_key.rsplit("-n", 1)[0]
    store = open_store(site, loaded, state_dir_from(params.get("state_dir"), os.environ))
    try:
        row = store.find_approval(key)
    finally:
        store.close()
    requested = row.requested_at if row else None
    if requested is not None and requested.tzinfo is None:
        requested = requested.replace(tzinfo=UTC)
    # The flow computes its deadline with the same function from the same row.
    deadline = (
        approval_deadline(requested, row.description, loaded.spec.approvals)
        if row is not None and requested is not None
        else None
    )
    return PendingApproval(
        flow_run,
        loaded.spec.name,
        key,
        row.rule if row else None,
        list(row.approvers_allowed) if row else [],
        requested,
        deadline,
    )


async def expire_approvals(*, now: datetime | None = None) -> list[UUID]:
    """Answer every request whose deadline passed, so its run follows the timeout policy."""
    moment = now or datetime.now(UTC)
    expired = []
    for flow_run in await suspended_runs():
        try:
            pending = pending_approval(flow_run)
        except UnattendedError:
            continue  # a spec or site that no longer loads: leave the run for a human
        if pending.deadline is not None and moment >= pending.deadline:
            await resume_with(
                flow_run.id,
                {
                    "decision": "reject",
                    "approver": SYSTEM_TIMEOUT_APPROVER,
                    "comment": "the approval deadline passed",
                },
            )
            expired.append(flow_run.id)
    return expired


class ResumeRefusedError(UnattendedError):
    """The server refused the answer (invalid for the form, or the run is not suspended)."""

    code = "validation_failed"


# The run turns Suspended a moment before its form's schema is stored; an answer in
# that window is refused with this reason, so it is retried briefly.
_SCHEMA_NOT_STORED = "schema not found"
_SCHEMA_WAIT_SECONDS = 10.0


async def resume_with(flow_run_id: UUID, run_input: dict[str, Any]) -> None:
    """Resume a suspended run with ``run_input``, exactly as the UI's form does."""
    deadline = asyncio.get_running_loop().time() + _SCHEMA_WAIT_SECONDS
    async with get_client() as client:
        while True:
            flow_run = await client.read_flow_run(flow_run_id)
            if flow_run.state is None or not flow_run.state.is_paused():
                raise ResumeRefusedError(
                    f"flow run {flow_run_id} is not waiting for approval",
                    details={"flow_run_id": str(flow_run_id)},
                )
            result = await client.resume_flow_run(flow_run_id, run_input=run_input)
            reason = str(getattr(result.details, "reason", "") or "")
            waiting_for_schema = _SCHEMA_NOT_STORED in reason.lower()
            if not waiting_for_schema or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.25)
    if result.status.value.upper() != "ACCEPT":
        reason = getattr(result.details, "reason", None) or "refused"
        raise ResumeRefusedError(
            f"the server refused the answer for flow run {flow_run_id}: {reason}",
            details={"flow_run_id": str(flow_run_id)},
        )


async def approve_run(
    flow_run_id: UUID,
    *,
    approver: str,
    reject: bool = False,
    comment: str = "",
    batch_size: int | None = None,
) -> None:
    """Answer a request as ``approver`` through Prefect's resume API."""
    run_input: dict[str, Any] = {
        "decision": "reject" if reject else "approve",
        "approver": approver,
        "comment": comment,
    }
    if batch_size is not None:
        run_input["batch_size"] = batch_size
    await resume_with(flow_run_id, run_input)


async def read_run(flow_run_id: UUID) -> FlowRun:
    """Return a flow run, or raise ``NotFound``."""
    async with get_client() as client:
        try:
            return await client.read_flow_run(flow_run_id)
        except Exception as exc:  # the client raises its own 404 type
            raise NotFound(
                f"no flow run {flow_run_id}", details={"flow_run_id": str(flow_run_id)}
            ) from exc
