"""The planner example: a batch of candidates, cheap checks, a re-ask, a surrogate fallback."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ConfigDict, Field

from acceptance import Attempt, Rejected, accept

pytestmark = pytest.mark.asyncio

LOWER, UPPER, COUNT = 0.0, 1.0, 4


class Plan(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")
    rationale: str
    candidates: list[float] = Field(max_length=1000)


def plan_checks(count: int, lower: float, upper: float):
    def batch_size(plan: Plan) -> None:
        if len(plan.candidates) != count:
            raise Rejected(f"{len(plan.candidates)} candidates; a batch has exactly {count}")

    def within_bounds(plan: Plan) -> None:
        # NaN compares false both ways, so it counts as outside.
        outside = [i for i, x in enumerate(plan.candidates) if not lower <= x <= upper]
        if outside:
            raise Rejected(f"candidates at positions {outside} lie outside [{lower}, {upper}]")

    def distinct(plan: Plan) -> None:
        if len({round(x, 10) for x in plan.candidates}) != len(plan.candidates):
            raise Rejected("the batch repeats a candidate")

    return [batch_size, within_bounds, distinct]


class ScriptedModel:
    """Answers in turn and keeps the re-ask messages it was sent."""

    def __init__(self, *answers: dict) -> None:
        self.answers = list(answers)
        self.prompts: list[list[str]] = []

    async def __call__(self, previous: tuple[Attempt[Plan], ...]) -> Plan:
        self.prompts.append([f"rejected by {a.rejected_by}: {a.reason}" for a in previous])
        return Plan.model_validate(self.answers[len(previous)])


def surrogate_fallback() -> Plan:
    step = (UPPER - LOWER) / (COUNT + 1)
    return Plan(
        rationale="evenly spaced", candidates=[LOWER + step * (i + 1) for i in range(COUNT)]
    )


class TestPlannerExample:
    async def test_nan_is_rejected_as_out_of_bounds_then_the_reask_passes(self):
        model = ScriptedModel(
            {"rationale": "try", "candidates": [0.1, math.nan, 0.3, 0.4]},
            {"rationale": "fixed", "candidates": [0.1, 0.2, 0.3, 0.4]},
        )
        outcome = await accept(
            model,
            checks=plan_checks(COUNT, LOWER, UPPER),
            attempts=2,
            fallback=surrogate_fallback,
            name="planner",
        )
        assert outcome.disposition == "accepted"
        assert outcome.attempts[0].rejected_by == "within_bounds"
        assert "[1]" in outcome.attempts[0].reason
        assert model.prompts[1] == [f"rejected by within_bounds: {outcome.attempts[0].reason}"]

    async def test_wrong_size_then_duplicates_then_fallback(self):
        model = ScriptedModel(
            {"rationale": "a", "candidates": [0.1, 0.2]},
            {"rationale": "b", "candidates": [0.1, 0.1, 0.3, 0.4]},
        )
        outcome = await accept(
            model,
            checks=plan_checks(COUNT, LOWER, UPPER),
            attempts=2,
            fallback=surrogate_fallback,
            name="planner",
        )
        assert outcome.disposition == "fallback"
        assert [a.rejected_by for a in outcome.attempts] == ["batch_size", "distinct"]
        assert outcome.value.candidates == pytest.approx([0.2, 0.4, 0.6, 0.8])

    async def test_unparsable_answer_is_a_schema_rejection(self):
        model = ScriptedModel(
            {"rationale": "a", "candidates": "many"},
            {"rationale": "b", "candidates": [0.1, 0.2, 0.3, 0.4]},
        )
        outcome = await accept(
            model, checks=plan_checks(COUNT, LOWER, UPPER), attempts=2, name="planner"
        )
        assert outcome.attempts[0].rejected_by == "schema"
        assert outcome.attempts[0].reason.startswith("candidates")

    async def test_an_infinite_candidate_is_rejected(self):
        model = ScriptedModel({"rationale": "a", "candidates": [0.1, math.inf, 0.3, 0.4]})
        outcome = await accept(
            model,
            checks=plan_checks(COUNT, LOWER, UPPER),
            fallback=surrogate_fallback,
            name="planner",
        )
        assert outcome.disposition == "fallback"
        assert outcome.attempts[0].rejected_by == "within_bounds"
