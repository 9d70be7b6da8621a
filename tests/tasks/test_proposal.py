"""Proposal types, the answer schema, and the cheap planner checks."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from acceptance import Rejected, accept
from tasks import Bounds, Proposal, candidates_hash, planner_checks

UNIT2 = Bounds.unit(2)


def _proposal(candidates: list[list[float]]) -> Proposal:
    return Proposal(rationale="r", candidates=candidates)


def _good(count: int = 4) -> list[list[float]]:
    return [[0.1 * i, 0.5] for i in range(count)]


def _run(proposal: Proposal | list[list[float]], count: int = 4) -> None:
    for check in planner_checks(UNIT2, count):
        check(proposal)


class TestBounds:
    def test_dim_is_the_number_of_coordinates(self) -> None:
        assert Bounds(lower=(0, 0, 0), upper=(1, 2, 3)).dim == 3

    def test_lengths_must_match(self) -> None:
        with pytest.raises(ValidationError, match="lower has 2 coordinates and upper has 1"):
            Bounds(lower=(0, 0), upper=(1,))

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_bounds_must_be_finite(self, bad: float) -> None:
        with pytest.raises(ValidationError, match="coordinate 1: bounds must be finite"):
            Bounds(lower=(0, 0), upper=(1, bad))

    def test_lower_must_be_below_upper(self) -> None:
        with pytest.raises(ValidationError, match=r"coordinate 0: lower 1\.0 is not below"):
            Bounds(lower=(1,), upper=(1,))

    def test_bounds_are_frozen(self) -> None:
        with pytest.raises(ValidationError):
            UNIT2.lower = (0.5, 0.5)  # type: ignore[misc]  # the point of the test


class TestProposal:
    def test_rationale_comes_first_in_the_schema(self) -> None:
        schema = Proposal.answer_schema()
        assert list(schema["properties"]) == ["rationale", "candidates"]

    def test_answer_schema_is_strict(self) -> None:
        schema = Proposal.answer_schema()
        assert schema["additionalProperties"] is False
        assert schema["required"] == ["rationale", "candidates"]
        assert "response_id" not in json.dumps(schema)

    def test_answer_schema_pins_count_and_dim(self) -> None:
        candidates = Proposal.answer_schema(count=8, dim=2)["properties"]["candidates"]
        assert candidates["minItems"] == candidates["maxItems"] == 8
        assert candidates["items"]["minItems"] == candidates["items"]["maxItems"] == 2

    def test_integers_are_accepted_as_coordinates(self) -> None:
        proposal = Proposal.model_validate_json('{"rationale": "r", "candidates": [[0, 1]]}')
        assert proposal.candidates == [[0.0, 1.0]]

    def test_unknown_fields_are_refused(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            Proposal.model_validate_json('{"rationale": "r", "candidates": [], "x": 1}')

    def test_deeply_nested_json_is_a_validation_error(self) -> None:
        text = '{"rationale": "r", "candidates": ' + "[" * 100_000 + "]" * 100_000 + "}"
        with pytest.raises(ValidationError, match="recursion limit"):
            Proposal.model_validate_json(text)

    def test_a_huge_batch_is_a_validation_error(self) -> None:
        text = json.dumps({"rationale": "r", "candidates": [[0.5, 0.5]] * 100_000})
        with pytest.raises(ValidationError, match="at most 4096"):
            Proposal.model_validate_json(text)

    def test_answer_leaves_out_the_response_id(self) -> None:
        proposal = Proposal(rationale="r", candidates=[[1.0]], response_id="abc")
        assert proposal.answer() == {"rationale": "r", "candidates": [[1.0]]}


class TestCandidatesHash:
    def test_hash_is_sha256_of_canonical_json(self) -> None:
        import hashlib

        expected = hashlib.sha256(b"[[0.5,1.0],[0.25,0.0]]").hexdigest()
        assert candidates_hash([[0.5, 1], [0.25, 0]]) == expected

    def test_nan_has_no_hash(self) -> None:
        with pytest.raises(ValueError, match="JSON compliant"):
            candidates_hash([[math.nan]])


class TestPlannerChecks:
    def test_checks_come_cheapest_first(self) -> None:
        names = [check.__name__ for check in planner_checks(UNIT2, 4)]
        assert names == ["batch_size", "finite", "dimensions", "within_bounds", "distinct"]

    def test_a_good_batch_passes(self) -> None:
        _run(_proposal(_good()))

    def test_a_plain_list_of_candidates_is_checked_too(self) -> None:
        with pytest.raises(Rejected, match="3 candidates; the batch takes exactly 4"):
            _run(_good(3))

    def test_wrong_batch_size_is_rejected(self) -> None:
        with pytest.raises(Rejected, match="5 candidates; the batch takes exactly 4"):
            _run(_proposal(_good(5)))

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_non_finite_coordinates_are_rejected_by_index(self, bad: float) -> None:
        candidates = _good()
        candidates[2][1] = bad
        with pytest.raises(Rejected, match=r"candidate 2 coordinate 1 is") as caught:
            _run(_proposal(candidates))
        assert caught.value.reason.startswith("not finite")

    def test_wrong_dimension_is_rejected_by_index(self) -> None:
        candidates = _good()
        candidates[3] = [0.5, 0.5, 0.5]
        with pytest.raises(Rejected, match="exactly 2 coordinates: candidate 3 has 3"):
            _run(_proposal(candidates))

    def test_out_of_bounds_is_rejected_with_position_and_number(self) -> None:
        candidates = _good()
        candidates[1] = [1.5, 0.5]
        with pytest.raises(Rejected, match=r"candidate 1 coordinate 0 = 1.5 outside \[0.0, 1.0\]"):
            _run(_proposal(candidates))

    def test_nan_lies_outside_the_bounds(self) -> None:
        within_bounds = planner_checks(UNIT2, 1)[3]
        with pytest.raises(Rejected, match="candidate 0 coordinate 0 = nan outside"):
            within_bounds(_proposal([[math.nan, 0.5]]))

    def test_repeats_are_rejected_after_rounding(self) -> None:
        candidates = _good()
        candidates[3] = [candidates[1][0] + 1e-12, 0.5]
        with pytest.raises(Rejected, match="candidate 3 repeats candidate 1"):
            _run(_proposal(candidates))

    def test_long_reasons_are_summarised(self) -> None:
        candidates = [[2.0, 2.0] for _ in range(4)]
        with pytest.raises(Rejected, match=r"and 3 more$"):
            _run(_proposal(candidates))

    @pytest.mark.asyncio
    async def test_gate_records_the_check_name(self) -> None:
        async def produce(previous: tuple[object, ...]) -> Proposal:
            return _proposal(_good(3))

        outcome = await accept(
            produce,
            checks=planner_checks(UNIT2, 4),
            fallback=lambda: _proposal(_good()),
            name="planner",
        )
        assert outcome.disposition == "fallback"
        assert outcome.attempts[0].rejected_by == "batch_size"
