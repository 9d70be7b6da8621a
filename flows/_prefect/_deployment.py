"""Submit a campaign: pin its inputs, register its deployment, start its run.

``submit_campaign`` is what ``unattended submit`` does, directly or through the
runner that is up (``flows._prefect._submissions``): it validates the spec and
site, records them in the campaign's provenance, registers (or updates) the
campaign's deployment in the state directory and on the server, and starts a flow
run, unless the campaign has one scheduled, running or suspended already
(``active_run``). ``TAG``, ``campaign_tag`` and ``ONE_RUN_AT_A_TIME`` are how
every campaign deployment is marked and bounded, here and by the runner that
serves it (``flows._prefect._service``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import (
    ConcurrencyLimitConfig,
    ConcurrencyLimitStrategy,
    FlowRun,
    StateType,
)
from prefect.context import AsyncClientContext
from prefect.deployments import run_deployment
from prefect.types.entrypoint import EntrypointType

from flows._engine._direct import code_version, open_store
from flows._engine._inputs import open_campaign
from flows._engine._registration import (
    Registration,
    deployment_name,
    read_registration,
    write_registration,
)
from flows._paths import campaign_dir, private_dir, state_dir_from
from flows._prefect._campaign import campaign_flow
from flows._prefect._submissions import Submitted, validate_submission
from tasks import load_site

TAG = "unattended"
ACTIVE_STATES = [
    StateType.SCHEDULED,
    StateType.PENDING,
    StateType.RUNNING,
    StateType.PAUSED,
    StateType.CANCELLING,
]

# Prefect's own half of "one live run per campaign": a second run of the deployment
# waits for the first to leave Running. It does not stop a run created by hand
# against a copied spec, nor a run while the first is suspended: the lease and the
# pinned inputs in the provenance do.
ONE_RUN_AT_A_TIME = ConcurrencyLimitConfig(
    limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
)


def campaign_tag(name: str) -> str:
    """Return the tag that marks a campaign's deployment and runs."""
    return f"campaign:{name}"


async def active_run(deployment_id: UUID) -> FlowRun | None:
    """Return the deployment's run that is scheduled, running or suspended, if any."""
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=ACTIVE_STATES)),
                deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]),
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
    accept_changes: bool = False,
) -> Submitted:
    """Validate, pin the inputs, register the campaign's deployment and start a run.

    A campaign that already has an active run is not started twice: that run is
    returned with ``already_active``. Inputs that differ from the pinned ones are
    refused (``SpecChanged``) unless ``accept_changes`` records a new revision.
    """
    environment = os.environ if env is None else env
    clock = _Steps()
    loaded, site_name = validate_submission(spec_path, site, environment)
    home = state_dir_from(state_dir, environment)
    name = loaded.spec.name
    store = open_store(load_site(site_name, env=environment), loaded, home)
    try:
        open_campaign(
            store,
            loaded,
            load_site(site_name, env=environment),
            code_version=code_version(),
            accept_changes=accept_changes,
            extend=True,  # a submission may raise rounds and budget: a recorded revision
        )
    finally:
        store.close()
    clock.mark("spec and provenance")
    # One API client for the whole submission: every Prefect helper below would open its
    # own (each builds a TLS context, ~30 ms at rest and 0.2 s at load 15 on 2 cores).
    async with AsyncClientContext.get_or_create():
        registered = read_registration(home, name)
        if registered is not None:
            existing = await active_run(UUID(registered.deployment_id))
            if existing is not None:
                return Submitted(
                    name, existing.id, UUID(registered.deployment_id), already_active=True
                )
            clock.mark("active run")
        parameters = {"spec_path": str(loaded.path), "site": site_name, "state_dir": str(home)}
        deployment = await campaign_flow.ato_deployment(
            # (state directory, name) is the campaign: another user's "demo" is another
            # deployment, never this one updated.
            name=deployment_name(name, home),
            parameters=parameters,
            tags=[TAG, campaign_tag(name)],
            description=f"unattended campaign {name} ({loaded.path}; state directory {home})",
            entrypoint_type=EntrypointType.MODULE_PATH,
            concurrency_limit=ONE_RUN_AT_A_TIME,
            enforce_parameter_schema=True,
        )
        # Both are sync/async dispatchers; inside a coroutine they return awaitables.
        deployment_id: UUID = await deployment.apply()  # type: ignore[misc]
        clock.mark("deployment")
        # The registration is the authority the runner and the flow read: written before
        # the run exists, so the run is never judged against a missing record.
        write_registration(
            home,
            Registration(
                campaign=name,
                deployment_id=str(deployment_id),
                deployment_name=deployment_name(name, home),
                **parameters,
            ),
        )
        flow_run: FlowRun = await run_deployment(  # type: ignore[misc]
            deployment_id, timeout=0, parameters=parameters, tags=[TAG, campaign_tag(name)]
        )
        clock.mark("run")
    private_dir(campaign_dir(home, name))
    return Submitted(name, flow_run.id, deployment_id, already_active=False, steps=clock.steps)


class _Steps:
    """Seconds between marks, by the name of the step each mark ends."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self._last = time.monotonic()

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.steps[step] = now - self._last
        self._last = now
