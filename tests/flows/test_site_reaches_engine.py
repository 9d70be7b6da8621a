"""The site's ``scheduler.walltime`` and ``cost.node_hours_per_verifier`` reach the engine.

Each test runs a real one-round campaign in this process (``run_direct``: real
executor, real provenance store) whose policy stops it when what the site says
is wired through, and lets it complete otherwise.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flows._engine._direct import run_direct
from flows._provenance import ProvenanceStore

SITE = """\
name = "site-costs"
max_concurrency = 2
task_timeout = 60.0
retries = 0
listen = "127.0.0.1"

[backend]
kind = "local"
executor = "thread"

[scheduler]
system = "slurm"
walltime = "00:10:00"

[cost]
node_hours_per_simulation = 0.01
node_hours_per_verifier = {verifier}
"""

POLICY = """\
[policy]
name = "site-costs"

[[rules]]
name = "stop"
description = "Stops the campaign when the site's setting reached the policy."
advice = "None: a test."
severity = "HARD_STOP"
when = "{when}"
"""

LATE = "allocation.has_walltime && allocation.walltime_remaining < 1800.0"
COSTLY = "budget.spent > 0.4"


def _run(folder: Path, when: str, env: dict[str, str], *, verifier: float = 0.0):
    (folder / "site.toml").write_text(SITE.format(verifier=verifier))
    (folder / "policy.toml").write_text(POLICY.format(when=when))
    spec = folder / "campaign.toml"
    spec.write_text(
        f"""\
name = "site-costs"
seed = 5
rounds = 1
batch_size = 2
attempts = 1
budget_node_hours = 10.0
site = "{folder / "site.toml"}"
policy = "policy.toml"

[objective]
lower = [0.0, 0.0]
upper = [1.0, 1.0]
simulation = "demo"
verifier_limit = 1e9

[planner]
kind = "surrogate"
"""
    )
    return run_direct(spec, state_dir=folder / "state", env=env)


class TestWalltime:
    @pytest.mark.asyncio
    async def test_the_allocation_start_plus_the_site_walltime_blocks_a_late_batch(
        self, tmp_path: Path
    ):
        started = str(time.time() - 60.0)  # ten-minute walltime, one minute gone
        result = await _run(tmp_path, LATE, {"SLURM_JOB_START_TIME": started})
        assert (result.status, result.error_code) == ("blocked", "policy_denied")

    @pytest.mark.asyncio
    async def test_without_an_allocation_start_the_walltime_is_unknown(self, tmp_path: Path):
        result = await _run(tmp_path, LATE, {})
        assert result.status == "completed"


class TestVerifierCost:
    @pytest.mark.asyncio
    async def test_two_verified_candidates_at_a_quarter_hour_each_cross_the_rule(
        self, tmp_path: Path
    ):
        result = await _run(tmp_path, COSTLY, {}, verifier=0.25)  # 0.5 node-hours > 0.4
        assert (result.status, result.error_code) == ("blocked", "policy_denied")

    @pytest.mark.asyncio
    async def test_the_checkpoint_keeps_the_verifier_hours_apart(self, tmp_path: Path):
        result = await _run(tmp_path, COSTLY, {}, verifier=0.125)  # 0.25: the rule stays quiet
        assert result.status == "completed"
        with ProvenanceStore.open(tmp_path / "state" / "campaigns" / "site-costs") as store:
            counters = store.load_checkpoint("site-costs").policy_state["campaign"]
        assert counters["verifier_hours"] == pytest.approx(0.25)
        assert counters["budget_spent"] == pytest.approx(0.02)
