"""``follow`` on a real run: the flow run's state and the progress read from its provenance."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from flows._cli._submit import follow
from flows._prefect._deployment import submit_campaign
from flows._prefect._service import CampaignService

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


class TestFollow:
    async def test_shows_the_rounds_then_how_to_approve_and_exits_waiting(
        self, prefect_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ):
        for item in EXAMPLES.iterdir():
            shutil.copy(item, tmp_path / item.name)
        spec = tmp_path / "campaign-approval.toml"
        spec.write_text(
            spec.read_text().replace('name = "demo-approval"', 'name = "follow-progress"')
        )
        submitted = await submit_campaign(spec, state_dir=tmp_path / "home")
        await CampaignService(
            query_seconds=0.5, state_dir=tmp_path / "home"
        ).run_once()  # runs until round 2 suspends
        capsys.readouterr()

        # follow is the CLI's synchronous loop (it calls asyncio.run): give it a thread.
        code = await asyncio.to_thread(follow, submitted.flow_run_id, wait_for_approval=False)

        lines = capsys.readouterr().out.splitlines()
        assert code == 5  # EXIT_CODES["awaiting_approval"]
        assert any(line.startswith("round 0: completed; best so far ") for line in lines)
        assert "round 1: batch finished: 8 done, 0 failed" in lines
        assert "round 2: waiting for approval by alice or bob (rule review-round-2)" in lines
        assert any(line.endswith(": Suspended") for line in lines)
        assert "  rule: review-round-2; approvers: alice, bob" in lines
