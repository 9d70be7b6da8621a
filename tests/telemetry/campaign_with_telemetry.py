"""Run a campaign the way the flow does, with telemetry from the site config (a subprocess).

Usage: ``python campaign_with_telemetry.py SPEC SITE STATE_DIR``. The OTel SDK's
global providers can be installed once per process, so each run gets its own.
Prints the campaign's status on the last line.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from flows._engine._round import Hooks
from flows._paths import campaign_dir
from flows._prefect._campaign import open_store, run_campaign
from flows._spec import load_campaign
from flows._telemetry import configure_telemetry
from tasks import load_site


async def main(spec: str, site_path: str, state_dir: str) -> str:
    """Configure telemetry like ``campaign_flow``, run every round, flush."""
    loaded = load_campaign(spec)
    site = load_site(site_path, env=os.environ)
    home = Path(state_dir)
    telemetry = configure_telemetry(
        campaign_dir(home, loaded.spec.name) / "telemetry.jsonl",
        campaign=loaded.spec.name,
        otlp_endpoint=site.otlp_endpoint,
    )
    store = open_store(site, loaded, home)
    store.ensure_campaign(
        loaded.spec.name, spec=loaded.raw, site=site.name, seed=loaded.spec.seed, code_version="t"
    )
    try:
        result = await run_campaign(loaded, site, store, Hooks(), env=os.environ)
    finally:
        telemetry.flush()
        store.close()
    return result.status


if __name__ == "__main__":
    print(asyncio.run(main(*sys.argv[1:4])))
