"""A recorded attempt comes back from the provenance as the value it was, NaN included."""

from __future__ import annotations

import math

from acceptance import Attempt
from flows._provenance import ProvenanceStore
from tasks import Proposal


def test_a_nan_proposal_round_trips_through_the_store_for_replay(tmp_path):
    store = ProvenanceStore.open(tmp_path / "campaign")
    store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="t")
    gate = store.record_gate_call(
        "c", 0, 1, gate="planner", budget=2, fallback_hash="h", fallback_value=[[0.5]]
    )
    nan_proposal = Proposal(rationale="r", candidates=[[0.1, math.nan], [math.inf, 0.2]])
    attempt = Attempt[Proposal](
        number=1, value=nan_proposal, rejected_by="finite", reason="NaN", duration=0.0
    )
    store.record_attempt(gate, attempt)
    (row,) = store.attempts(gate)
    store.close()
    replayed = Attempt[Proposal].model_validate(row)
    assert math.isnan(replayed.value.candidates[0][1])
    assert replayed.value.candidates[1][0] == math.inf
    assert replayed.rejected_by == "finite"
