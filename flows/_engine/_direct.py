"""Run a campaign without Prefect, in this process (``python -m flows._cli._direct SPEC``).

The same engine, store and executor as the Prefect flow (``run_campaign`` is
shared: the flow calls it with Prefect hooks), driven in this process. Nothing
here imports Prefect, so a restart costs the engine's own start only: this is
what the crash suite kills and starts again. A policy that asks for approval
escalates, because a process without a deployment cannot suspend.

``flows._cli._direct`` is its command line: one JSON line (status, error_code,
rounds_completed, message) and the CLI's exit codes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

from flows._engine._answers import AnswerJournal
from flows._engine._failpoints import arm as arm_failpoints
from flows._engine._failpoints import failpoint
from flows._engine._fencing import RecoverySettings, hold_lease
from flows._engine._inputs import open_campaign
from flows._engine._left_open import end_left_open
from flows._engine._notify import NoticeSender, Notifier, chain
from flows._engine._proof import ApproverCodes
from flows._engine._round import CampaignEngine, CampaignResult, Hooks
from flows._engine._simulation import build_gate, build_run_batch
from flows._engine._store_thread import StoreThread
from flows._engine._tally import TALLY_FILE, TaskTally
from flows._paths import approvers_dir, campaign_dir, state_dir_from
from flows._provenance import ProvenanceStore
from flows._settings import Settings
from flows._spec import LoadedSpec, load_campaign
from policies import BudgetExceeded, classify
from tasks import BudgetUsed, SiteConfig, load_site

_log = logging.getLogger("unattended.campaign")


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


async def run_campaign(
    loaded: LoadedSpec,
    site: SiteConfig,
    store: ProvenanceStore,
    hooks: Hooks,
    *,
    env: Mapping[str, str],
    work_dir: Path | None = None,
    approvers_dir: Path | None = None,
    run_link: Callable[[], tuple[str, str] | None] | None = None,
    owner: str | None = None,
) -> CampaignResult:
    """Run the campaign's remaining rounds on the site's executor, holding its lease.

    ``env`` is the campaign's environment (secrets, the allocation's window,
    failpoints, the lease's timings: ``flows._settings``). ``work_dir`` receives
    asyncflow's per-engine folder (the campaign directory); ``approvers_dir``
    holds the enrolled approvers' one-time-code secrets; ``run_link`` gives
    notices the run's UI link and id (the campaign's ``[notify]``, else the
    site's, says where they go); ``owner`` names the lease's holder (the flow
    run id; this process by default).

    Raises:
        CampaignFenced: another live run holds the campaign (nothing is touched).
    """
    settings = Settings.from_env(env)  # a bad variable stops here, before any write
    arm_failpoints(settings)
    holder = owner or hooks.flow_run_id or f"process:{socket.gethostname()}:{os.getpid()}"
    name = loaded.spec.name
    notify = loaded.spec.notify or site.notify
    notices = None
    if notify is not None and work_dir is not None:
        journal = Path(work_dir) / "notifications.jsonl"
        notices = NoticeSender(Notifier(notify, name, journal, run_link or (lambda: None)))
        hooks = dataclasses.replace(hooks, on_event=chain(hooks.on_event, notices.on_event))
    try:
        with hold_lease(store, name, holder, RecoverySettings.from_env(env)) as previous:
            # The run's calls of the store run off the event loop, in order, in one worker
            # thread; every one of them is done before the lease is given back.
            async with StoreThread(store) as writes:
                # The run's ending is its last write, made while it still holds the lease: the
                # runner's watchdog never takes a run that recorded how it ended for an orphan.
                try:
                    result = await _run_rounds(
                        loaded,
                        site,
                        writes,
                        hooks,
                        env=env,
                        work_dir=work_dir,
                        approvers_dir=approvers_dir,
                        killed=previous is not None and not previous.released,
                    )
                except Exception as exc:
                    await writes.run(
                        record_ending, store, name, holder, "failed", classify(exc).code
                    )
                    raise
                await writes.run(
                    record_ending, store, name, holder, result.status, result.error_code
                )
                return result
    finally:
        if notices is not None:  # a notice emitted just before the end still goes, once
            await notices.aclose()


def record_ending(
    store: ProvenanceStore, name: str, flow_run_id: str, status: str, code: str | None
) -> bool:
    """Record how run ``flow_run_id`` ended (``run_ending``), best effort; return whether it was.

    A store that cannot take the write (a full disk) leaves the run without an ending: the
    runner's watchdog then continues the campaign, as after a crash.
    """
    try:
        store.record_run_ending(name, flow_run_id, status, code)
    except Exception as exc:  # noqa: BLE001  # the run's own ending is what the caller reports
        _log.warning("%s: run %s's ending not recorded (%s)", name, flow_run_id, classify(exc).code)
        return False
    return True


async def _run_rounds(
    loaded: LoadedSpec,
    site: SiteConfig,
    writes: StoreThread[ProvenanceStore],
    hooks: Hooks,
    *,
    env: Mapping[str, str],
    work_dir: Path | None,
    approvers_dir: Path | None,
    killed: bool,
) -> CampaignResult:
    from tasks import AllocationExecutor

    name = loaded.spec.name
    store = writes.store
    campaigns = await writes.run(store.campaigns)
    before = next((c["status"] for c in campaigns if c["name"] == name), None)
    if work_dir is not None:  # how far a running batch is, for `run`'s follower
        tally = TaskTally(Path(work_dir) / TALLY_FILE)
        hooks = dataclasses.replace(hooks, on_event=chain(hooks.on_event, tally.on_event))
    checkpoint = await writes.load_checkpoint(name)
    done = checkpoint.last_completed_round
    if before in ("running", "failed") and (done is not None or before == "failed" or killed):
        # Started again after a crash or a stopped runner, not after an approval; also
        # when the crash came before round 0 completed (a fresh campaign says "running"
        # too, but no earlier run left its lease unreleased or recorded a failure).
        hooks.on_event("recovered", {"round": 0 if done is None else done + 1})
    await writes.set_campaign_status(name, "running")
    failpoint("campaign_start")
    folder = str(work_dir) if work_dir is not None else None
    # Jobs a crashed run left open are ended first, so their cost is known and stops.
    await end_left_open(store, name, site, env, folder)
    # The site's allocation budget is the campaign's: what earlier runs' jobs used counts.
    usage = await writes.run(store.allocation_usage, name)
    used = BudgetUsed(requests=usage.requests, node_hours=usage.node_hours)
    entered = False
    try:
        async with AllocationExecutor.from_site(
            site, work_dir=folder, budget_used=used
        ) as executor:
            entered = True
            # Every change of the site's batch jobs (requested, started, ended and why)
            # goes to the provenance; `unattended status` reads the queue line from it.
            # Queued, not waited for: a write never holds up the tasks (in order all the same).
            executor.on_allocation_change(
                lambda records: writes.later(store.record_allocations, name, list(records))
            )
            # A controller that does not answer is an event, not the end of the jobs.
            executor.on_scheduler_outage(
                lambda kind, details: writes.later(store.record_event, name, kind, details=details)
            )
            checks, scores = build_gate(executor, loaded, site)
            engine = CampaignEngine(
                loaded=loaded,
                store=writes,
                run_batch=build_run_batch(executor, writes, loaded, site),
                node_hours_per_simulation=site.cost.node_hours_per_simulation,
                checks=checks,
                scores=scores,
                hooks=hooks,
                env=dict(env),
                walltime_seconds=site.scheduler.walltime_seconds,
                node_hours_per_verifier=site.cost.node_hours_per_verifier,
                answers=AnswerJournal(Path(work_dir) / "answers.jsonl") if work_dir else None,
                approver_codes=ApproverCodes(approvers_dir) if approvers_dir else None,
                allocation_end=executor.allocation_end,
            )
            # The jobs released when the executor closes are recorded by the hook too.
            return await engine.run()
    except BudgetExceeded as exc:
        if entered:  # the engine records its own stops; this one is not the first request
            raise
        # The first allocation is beyond what earlier runs left: stopped, recorded and told.
        last = checkpoint.last_completed_round
        index = 0 if last is None else last + 1
        await writes.set_campaign_status(name, "blocked", exc.code, round_index=index)
        hooks.on_event("stopped", {"round": index, "status": "blocked", "code": exc.code})
        return CampaignResult("blocked", exc.code, index, exc.message)


async def run_direct(
    spec_path: str | Path,
    *,
    site: str | None = None,
    state_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> CampaignResult:
    """Run (or continue) a campaign in this process, without Prefect; return how it ended."""
    environment = os.environ if env is None else env
    loaded = load_campaign(spec_path)
    site_config = load_site(site or loaded.site_location(), env=environment)
    home = state_dir_from(state_dir, environment)
    directory = campaign_dir(home, loaded.spec.name)
    store = open_store(site_config, loaded, home)
    try:
        open_campaign(store, loaded, site_config, code_version=code_version())
        # No suspend hook: the policy turns ASK into Escalate.
        return await run_campaign(
            loaded,
            site_config,
            store,
            Hooks(),
            env=environment,
            work_dir=directory,
            approvers_dir=approvers_dir(home),
        )
    finally:
        store.close()
