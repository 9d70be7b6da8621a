"""A real recorded campaign for the report and replay tests.

``recorded_campaign`` runs the demo approval campaign once per session with the
engine itself (local site, real executables, a real SQLite provenance database):
four rounds, a fallback in round 1, an approval in round 2 that one person who
is not allowed answers before alice approves, and a policy retry in round 3
(two gate calls). The transcript is changed so that round 0's accepted rationale
carries a ``<script>`` tag. ``recorded_report`` is its report, written once
through the CLI.

``subset_campaign`` runs the same demo for three rounds with a simulation whose
objective crosses zero (``signed_objective.py``); in round 2 alice approves only
candidates #0, #2 and #5 of the eight proposed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"
SIGNED_OBJECTIVE = Path(__file__).resolve().parent / "signed_objective.py"
SUBSET = [0, 2, 5]  # the candidates alice keeps in the subset campaign's round 2
PLANTED = "<script>alert('planted')</script> spread the batch"


@dataclass(frozen=True)
class RecordedCampaign:
    """Where the recorded campaign lives."""

    name: str
    folder: Path  # the copied demo files (policies, spec)
    database: Path  # the campaign directory holding provenance.db
    planted: str = PLANTED  # round 0's accepted rationale


# A SOFT_BLOCK that refuses round 3's first gate call once, so the record holds a
# round with two gate calls (a policy retry); the re-ask gets the same answer again.
SECOND_LOOK = """
[[rules]]
name = "second-look"
severity = "SOFT_BLOCK"
when = "round.index == 3 && round.attempt == 1"
"""


def _prepare(folder: Path) -> None:
    transcript = folder / "transcript.jsonl"
    lines = transcript.read_text().splitlines()
    entry = json.loads(lines[1])  # round 0, attempt 2: the accepted answer
    entry["answer"]["rationale"] = PLANTED
    lines[1] = json.dumps(entry)
    lines.append(lines[-1])  # round 3, gate call 2: the answer after the policy's retry
    transcript.write_text("\n".join(lines) + "\n")
    policy = folder / "approval-policy.toml"
    policy.write_text(policy.read_text() + SECOND_LOOK)


async def run_engine(spec_path: Path, database: Path, answers: Iterator[Any]) -> Any:
    """Run the campaign with the engine itself; approvals get the next of ``answers``."""
    from flows._engine._approval import ApprovalRequest
    from flows._engine._round import CampaignEngine, Hooks
    from flows._engine._simulation import build_gate, build_run_batch
    from flows._engine._store_thread import StoreThread
    from flows._prefect._approval_form import Approval
    from flows._provenance import ProvenanceStore
    from flows._spec import load_campaign
    from tasks._executor import AllocationExecutor
    from tasks._site import load_site

    async def suspend(request: ApprovalRequest, refused: int) -> Approval:
        return next(answers)

    loaded = load_campaign(spec_path)
    site = load_site("local", env=os.environ)
    store = ProvenanceStore.open(database)
    try:
        store.ensure_campaign(
            loaded.spec.name, spec=loaded.raw, site="local", seed=loaded.spec.seed, code_version="t"
        )
        async with (
            StoreThread(store) as writes,
            AllocationExecutor.from_site(site) as executor,
        ):
            checks, scores = build_gate(executor, loaded)
            engine = CampaignEngine(
                loaded=loaded,
                store=writes,
                run_batch=build_run_batch(executor, writes, loaded),
                node_hours_per_simulation=site.cost.node_hours_per_simulation,
                checks=checks,
                scores=scores,
                hooks=Hooks(suspend=suspend),
                env={},
            )
            return await engine.run()
    finally:
        store.close()


async def _run(spec_path: Path, database: Path) -> None:
    from flows._prefect._approval_form import Approval

    answers = iter(
        [
            Approval(decision="approve", approver="mallory", comment="not mine to give"),
            Approval(decision="approve", approver="alice", comment="round 2 reviewed"),
        ]
    )
    result = await run_engine(spec_path, database, answers)
    assert result.status == "completed", result


@pytest.fixture(scope="session")
def engine_runner() -> Any:
    """Return ``run_engine``: a campaign run by the engine with scripted approval answers."""
    return run_engine


@pytest.fixture(scope="session")
def recorded_campaign(tmp_path_factory: pytest.TempPathFactory) -> RecordedCampaign:
    """Run the demo approval campaign once and return where it is recorded."""
    folder = tmp_path_factory.mktemp("demo")
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    _prepare(folder)
    database = folder / "state" / "campaigns" / "demo-approval"
    asyncio.run(_run(folder / "campaign-approval.toml", database))
    return RecordedCampaign("demo-approval", folder, database)


@dataclass(frozen=True)
class WrittenReport:
    """A report written by ``unattended report`` and what the command printed."""

    path: Path  # report.html
    printed: str


def write_report(campaign: RecordedCampaign, output: Path) -> WrittenReport:
    """Write ``campaign``'s report into ``output`` through the CLI."""
    from flows._cli import main
    from flows._report import REPORT_FILE

    printed = io.StringIO()
    argv = ["report", campaign.name, "--db", str(campaign.database), "--output", str(output)]
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return WrittenReport(output / REPORT_FILE, printed.getvalue())


@pytest.fixture(scope="session")
def report_writer() -> Any:
    """Return ``write_report``: a campaign's report written through the CLI."""
    return write_report


@pytest.fixture(scope="session")
def recorded_report(
    recorded_campaign: RecordedCampaign, tmp_path_factory: pytest.TempPathFactory
) -> WrittenReport:
    """Return the recorded campaign's report, written once through the CLI."""
    return write_report(recorded_campaign, tmp_path_factory.mktemp("report") / "out")


@pytest.fixture(scope="session")
def subset_campaign(tmp_path_factory: pytest.TempPathFactory) -> RecordedCampaign:
    """Run the demo approval campaign for three rounds with a subset approval in round 2."""
    from flows._prefect._approval_form import Approval

    folder = tmp_path_factory.mktemp("subset")
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    spec = folder / "campaign-approval.toml"
    argv = json.dumps([sys.executable, str(SIGNED_OBJECTIVE)])
    text = spec.read_text().replace("rounds = 4", "rounds = 3")
    spec.write_text(text.replace('simulation = "demo"', f"simulation = {argv}"))
    database = folder / "state" / "campaigns" / "demo-approval"
    answers = iter([Approval(decision="approve", approver="alice", candidates=SUBSET)])
    result = asyncio.run(run_engine(spec, database, answers))
    assert result.status == "completed", result
    return RecordedCampaign("demo-approval", folder, database)
