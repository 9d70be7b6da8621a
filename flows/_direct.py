"""Run a campaign without Prefect: ``python -m flows._direct SPEC [--site S] [--state-dir DIR]``.

The same engine, store and executor as the Prefect flow (``run_campaign`` is
shared: the flow calls it with Prefect hooks), driven in this process. Nothing
here imports Prefect, so a restart costs the engine's own start only: this is
what the crash suite kills and starts again. A policy that asks for approval
escalates, because a process without a deployment cannot suspend.

It prints one JSON line (status, error_code, rounds_completed, message) and
exits like the CLI: 0 completed, 1 failed, 3 blocked, 4 escalated, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

from flows._answers import AnswerJournal
from flows._paths import campaign_dir, state_dir_from
from flows._provenance import ProvenanceStore
from flows._round import CampaignEngine, CampaignResult, Hooks
from flows._simulation import build_checks, build_run_batch
from flows._spec import LoadedSpec, load_campaign
from policies import UnattendedError
from tasks import SiteConfig, load_site

EXIT_CODES = {"completed": 0, "failed": 1, "blocked": 3, "escalated": 4, "awaiting_approval": 5}


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
            answers=AnswerJournal(Path(work_dir) / "answers.jsonl") if work_dir else None,
        )
        return await engine.run()


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
    site_config = load_site(site or loaded.spec.site, env=environment)
    home = state_dir_from(state_dir, environment)
    directory = campaign_dir(home, loaded.spec.name)
    store = open_store(site_config, loaded, home)
    try:
        store.ensure_campaign(
            loaded.spec.name,
            spec=loaded.raw,
            site=site_config.name,
            seed=loaded.spec.seed,
            code_version=code_version(),
        )
        # No suspend hook: the policy turns ASK into Escalate.
        return await run_campaign(loaded, site_config, store, Hooks(), work_dir=directory)
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the campaign, print one JSON line; return the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m flows._direct", description="Run a campaign without Prefect."
    )
    parser.add_argument("spec", help="the campaign spec (TOML)")
    parser.add_argument("--site", default=None, help="a site name or TOML path")
    parser.add_argument("--state-dir", default=None, help="default: $UNATTENDED_HOME")
    args = parser.parse_args(argv)
    try:
        result = asyncio.run(run_direct(args.spec, site=args.site, state_dir=args.state_dir))
    except UnattendedError as exc:
        if exc.code in {"spec_invalid", "site_invalid"}:
            print(f"error: {exc.message}", file=sys.stderr)
            return 2
        raise
    print(
        json.dumps(
            {
                "status": result.status,
                "error_code": result.error_code,
                "rounds_completed": result.rounds_completed,
                "message": result.message,
            }
        ),
        flush=True,
    )
    return EXIT_CODES.get(result.status, 1)


if __name__ == "__main__":
    sys.exit(main())
