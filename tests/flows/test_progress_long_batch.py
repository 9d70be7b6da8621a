"""``run``'s plain lines during a long batch: how many tasks ended, every tenth or minute.

The engine counts its ``task`` events into the campaign directory's tally (a real
run writes it: checked through the direct runner); the follower reads it beside the
provenance, which has the batch's results only once it ends (a real run writing the
tally: ``tests/reliability/faults/test_tally.py``). The follower's clock is handed
in, so "long" is decided without waiting.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows._cli._progress import CampaignProgress, read_progress
from flows._engine._tally import TALLY_FILE, TaskTally
from flows._provenance import ProvenanceStore

CAMPAIGN = "long"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def running(tmp_path: Path) -> Iterator[ProvenanceStore]:
    """A campaign whose round 0 runs a 100-task batch (no result recorded yet)."""
    writer = ProvenanceStore.open(tmp_path)
    writer.ensure_campaign(CAMPAIGN, spec={}, site="local", seed=1, code_version="test")
    writer.start_round(CAMPAIGN, 0)
    writer.record_decision(CAMPAIGN, 0, 1, {"outcome": "continue"})
    writer.record_batch_launched(
        "b0", campaign=CAMPAIGN, round_index=0, candidates=[[0.01 * i] for i in range(100)],
        backend="local",
    )  # fmt: skip
    writer.close()
    reader = ProvenanceStore.open(tmp_path, read_only=True)
    yield reader
    reader.close()


def end_tasks(tally: TaskTally, done: int, failed: int = 0) -> None:
    for _ in range(done):
        tally.on_event("task", {"round": 0, "status": "done"})
    for _ in range(failed):
        tally.on_event("task", {"round": 0, "status": "failed"})


def test_a_long_batch_gets_a_line_each_tenth_or_each_minute(
    running: ProvenanceStore, tmp_path: Path
) -> None:
    tally = TaskTally(tmp_path / TALLY_FILE, every_seconds=0)
    clock, out = Clock(), io.StringIO()
    progress = CampaignProgress(live=False, stream=out, tally=tally.path, clock=clock)

    def poll_at(moment: float) -> list[str]:
        clock.now = moment
        before = out.getvalue()
        progress.update(read_progress(running, CAMPAIGN))
        return [line for line in out.getvalue()[len(before) :].splitlines() if "ended" in line]

    assert poll_at(0) == []
    end_tasks(tally, 12)
    assert poll_at(10) == []  # not long yet: a short batch says nothing more
    assert poll_at(31) == ["round 0: 12/100 tasks ended"]
    assert poll_at(32) == []  # nothing new
    end_tasks(tally, 2, failed=1)
    assert poll_at(40) == []  # within the same tenth, within the minute
    assert poll_at(92) == ["round 0: 15/100 tasks ended (1 failed)"]  # a minute on
    end_tasks(tally, 10)
    assert poll_at(93) == ["round 0: 25/100 tasks ended (1 failed)"]  # another tenth


def test_a_short_batch_stays_quiet(running: ProvenanceStore, tmp_path: Path) -> None:
    tally = TaskTally(tmp_path / TALLY_FILE, every_seconds=0)
    clock, out = Clock(), io.StringIO()
    progress = CampaignProgress(live=False, stream=out, tally=tally.path, clock=clock)
    progress.update(read_progress(running, CAMPAIGN))
    end_tasks(tally, 100)
    clock.now = 29
    progress.update(read_progress(running, CAMPAIGN))
    assert "tasks ended" not in out.getvalue()
