"""A real run keeps the running batch's tally in the campaign directory (``run`` reads it)."""

from __future__ import annotations

import json

import pytest

from flows._engine._direct import run_direct
from flows._engine._tally import TALLY_FILE

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def test_a_real_run_keeps_the_tally_in_the_campaign_directory(fault_campaign):
    campaign = fault_campaign()
    spec = campaign.write({"1:1": "exit"})
    result = await run_direct(spec, state_dir=campaign.home, env={})
    assert result.status == "completed"
    tally = json.loads((campaign.database.parent / TALLY_FILE).read_text())
    assert tally["round"] == 1
    # Written at most once a second, so the newest ends may be unsaid; the first is said.
    assert 1 <= tally["ended"] <= 4
    assert tally["interrupted"] == 0
