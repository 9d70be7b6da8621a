"""The campaign as a Prefect flow: one deployment per campaign, approvals by suspend/resume.

On resume Prefect runs the flow function again from the top in a new process.
Everything here is replay-safe because ``CampaignEngine`` reads its checkpoint
from the provenance database and skips finished work; Prefect task results are
never cached or persisted (``NO_CACHE``), so the database is the only memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.flow_runs import suspend_flow_run
from prefect.states import Completed, Failed, State

from flows._approval import ApprovalRequest, describe
from flows._approval_form import Approval, approval_form
from flows._paths import campaign_dir, state_dir_from
from flows._provenance import ProvenanceStore
from flows._round import CampaignEngine, CampaignResult, Hooks
from flows._simulation import build_checks, build_run_batch
from flows._spec import LoadedSpec, load_campaign
from flows._telemetry import configure_telemetry
from tasks import SiteConfig, load_site

FLOW_NAME = "unattended-campaign"


def code_version() -> str:
    """Return the installed version, with the git commit when run from a checkout."""
    version = metadata.version("unattended")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version}+g{commit}" if commit else version


def open_store(site: SiteConfig, loaded: LoadedSpec, state_dir: Path) -> ProvenanceStore:
    """Open the campaign's provenance store: the site's URL, else SQLite in its directory."""
    if site.provenance_url is not None:
        return ProvenanceStore.open(site.provenance_url.get_secret_value())
    return ProvenanceStore.open(campaign_dir(state_dir, loaded.spec.name))


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
    answer: Approval = await suspend_flow_run(wait_for_input=form, key=request.pause_key(refused))
    return answer


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


async def run_campaign(
    loaded: LoadedSpec,
    site: SiteConfig,
    store: ProvenanceStore,
    hooks: Hooks,
    *,
    work_dir: Path | None = None,
) -> CampaignResult:
    """Run the campaign's remaining rounds on the site's executor.

    ``work_dir`` receives asyncflow's per-engine folder (the campaign directory).
    """
    from tasks import AllocationExecutor

    store.set_campaign_status(loaded.spec.name, "running")
    folder = str(work_dir) if work_dir is not None else None
    async with AllocationExecutor.from_site(site, work_dir=folder) as executor:
        engine = CampaignEngine(
            loaded=loaded,
            store=store,
            run_batch=build_run_batch(executor, store, loaded),
            node_hours_per_simulation=site.cost.node_hours_per_simulation,
            checks=build_checks(executor, loaded),
            hooks=hooks,
            env=dict(os.environ),
        )
        return await engine.run()


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
