"""The provenance store is what the round engine asks for: ``CampaignStore``, checked by mypy."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One mypy run over both cases: the real store is accepted, half a store is refused.
_PROGRAM = """
from flows._engine._store import CampaignStore
from flows._provenance import ProvenanceStore


def engine_store(store: CampaignStore) -> None:
    store.record_decision("c", 0, 1, {"outcome": "continue"})


def hand_over(real: ProvenanceStore) -> None:
    engine_store(real)


class HalfAStore:
    def record_decision(self, name: str, index: int, seq: int, record: object) -> None: ...


def hand_over_half(half: HalfAStore) -> None:
    engine_store(half)
"""


@pytest.mark.timeout(300)
def test_a_provenance_store_is_a_campaign_store_and_half_a_store_is_not(tmp_path: Path):
    program = tmp_path / "store_program.py"
    program.write_text(textwrap.dedent(_PROGRAM))
    out = subprocess.run(
        # The project's own mypy settings, so this run and test_lint's share mypy's
        # cache (the second of the two is quick); the program's functions are annotated,
        # so they are checked without --strict.
        [sys.executable, "-m", "mypy", "--no-error-summary", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, out.stdout
    assert 'incompatible type "HalfAStore"; expected "CampaignStore"' in errors[0]
