"""The campaign as a Prefect flow: one deployment per campaign, approvals by suspend/resume.

On resume Prefect runs the flow function again from the top in a new process.
Everything here is replay-safe because ``CampaignEngine`` reads its checkpoint
from the provenance database and skips finished work; Prefect task results are
never cached or persisted (``NO_CACHE``), so the database is the only memory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.flow_runs import suspend_flow_run
from prefect.states import Completed, Failed

from flows._approval import ApprovalRequest, describe
from flows._approval_form import Approval, approval_form
from flows._direct import code_version, open_store, run_campaign
from flows._paths import campaign_dir, state_dir_from
from flows._round import CampaignResult, Hooks
from flows._spec import load_campaign
from flows._telemetry import configure_telemetry
from tasks import load_site

# code_version, open_store and run_campaign live in flows._direct (no Prefect there) and
# are re-exported here for the callers that import them from this module.
__all__ = [
    "FLOW_NAME",
    "campaign_flow",
    "code_version",
    "final_state",
    "open_store",
    "run_campaign",
]

FLOW_NAME = "unattended-campaign"


async def _as_task(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run one step of a round as a Prefect task, so the UI shows the round's progress."""

    async def step() -> Any:
        return await fn()

    prefect_task = task(name=name, cache_policy=NO_CACHE, persist_result=False, retries=0)(step)
    return await prefect_task()


async def _suspend_for(request: ApprovalRequest, refused: int) -> Approval:
    """Suspend the flow run until an answer arrives on the request's form."""
    form = approval_form(
        batch_size=len(request.proposed), description=describe(request), allow_override=True
    )
    # suspend_flow_run dispatches sync/async; awaited inside a coroutine it is async.
    answer = await suspend_flow_run(  # type: ignore[misc]
        wait_for_input=form, key=request.pause_key(refused)
    )
    return cast(Approval, answer)


def _event_logger() -> Callable[[str, Any], None]:
    logger = get_run_logger()

    def on_event(kind: str, data: Any) -> None:
        if kind != "task":  # one line per simulation would flood the run's log
            logger.info("%s %s", kind, dict(data))

    return on_event


@flow(name=FLOW_NAME, persist_result=False, log_prints=False, validate_parameters=True)
async def campaign_flow(spec_path: str, site: str = "local", state_dir: str | None = None) -> Any:
    """Run (or continue) one campaign from its spec file."""
    loaded = load_campaign(spec_path)
    site_config = load_site(site, env=os.environ)
    home = state_dir_from(state_dir, os.environ)
    directory = campaign_dir(home, loaded.spec.name)
    telemetry = configure_telemetry(
        directory / "telemetry.jsonl",
        campaign=loaded.spec.name,
        otlp_endpoint=site_config.otlp_endpoint,
    )
    store = open_store(site_config, loaded, home)
    store.ensure_campaign(
        loaded.spec.name,
        spec=loaded.raw,
        site=site_config.name,
        seed=loaded.spec.seed,
        code_version=code_version(),
    )
    context = FlowRunContext.get()
    flow_run_id = str(context.flow_run.id) if context and context.flow_run else None
    try:
        result = await run_campaign(
            loaded,
            site_config,
            store,
            Hooks(
                step=_as_task,
                suspend=_suspend_for,
                flow_run_id=flow_run_id,
                on_event=_event_logger(),
            ),
            work_dir=directory,
        )
    finally:
        telemetry.flush()
        store.close()
    return final_state(result)


def final_state(result: CampaignResult) -> State[Any]:
    """Map how the campaign ended onto the flow run's state (the database holds the detail)."""
    data = {
        "status": result.status,
        "error_code": result.error_code,
        "rounds_completed": result.rounds_completed,
    }
    if result.status == "completed":
        return Completed(message="campaign completed", data=data)
    return Failed(
        message=f"campaign {result.status} ({result.error_code}): {result.message}", data=data
    )


def main() -> None:  # pragma: no cover - a convenience for `python -m flows._campaign SPEC`
    """Run a campaign flow in this process (ephemeral; approvals need a deployment)."""
    sys.exit(0 if campaign_flow(sys.argv[1]) else 1)
