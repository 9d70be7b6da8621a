"""Behaviour of ``accept``: order of checks, budget, re-ask, fallback, failures."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from acceptance import Attempt, NotAccepted, Outcome, Rejected, accept

pytestmark = pytest.mark.asyncio


class BoomError(RuntimeError):
    """A failure, not a rejection."""


def producing(*values):
    """Return a sync producer that yields ``values`` in turn and records what it saw."""
    seen: list[tuple[Attempt, ...]] = []

    def producer(previous):
        seen.append(previous)
        return values[len(previous)]

    producer.seen = seen  # type: ignore[attr-defined]
    return producer


def reject_below(limit):
    def at_least(value):
        if value < limit:
            raise Rejected(f"{value} is below {limit}")

    return at_least


class TestBudget:
    async def test_default_budget_is_one_attempt(self):
        producer = producing(1, 5)
        with pytest.raises(NotAccepted) as caught:
            await accept(producer, checks=[reject_below(3)], name="g")
        assert len(caught.value.attempts) == 1
        assert len(producer.seen) == 1

    @pytest.mark.parametrize("attempts", [0, -1])
    async def test_budget_below_one_is_a_value_error(self, attempts):
        with pytest.raises(ValueError, match="attempts"):
            await accept(producing(1), attempts=attempts, name="g")

    async def test_stops_at_first_accepted_attempt(self):
        producer = producing(1, 5, 9)
        outcome = await accept(producer, checks=[reject_below(3)], attempts=3, name="g")
        assert outcome.value == 5
        assert outcome.disposition == "accepted"
        assert [a.number for a in outcome.attempts] == [1, 2]
        assert len(producer.seen) == 2


class TestReask:
    async def test_producer_sees_every_earlier_attempt_with_reason(self):
        producer = producing(1, 2, 7)
        await accept(producer, checks=[reject_below(3)], attempts=3, name="g")
        assert producer.seen[0] == ()
        third_call = producer.seen[2]
        assert [a.value for a in third_call] == [1, 2]
        assert [a.reason for a in third_call] == ["1 is below 3", "2 is below 3"]
        assert all(a.rejected_by == "at_least" for a in third_call)


class TestChecks:
    async def test_checks_run_in_order_and_stop_at_first_rejection(self):
        ran: list[str] = []

        def cheap(value):
            ran.append("cheap")
            raise Rejected("cheap says no")

        async def expensive(value):
            ran.append("expensive")

        with pytest.raises(NotAccepted):
            await accept(producing(1), checks=[cheap, expensive], name="g")
        assert ran == ["cheap"]

    async def test_rejected_by_is_the_check_name_unless_rejected_names_a_stage(self):
        def named(value):
            raise Rejected("no", check="domain")

        def anonymous(value):
            raise Rejected("no")

        with pytest.raises(NotAccepted) as one:
            await accept(producing(1), checks=[named], name="g")
        with pytest.raises(NotAccepted) as two:
            await accept(producing(1), checks=[anonymous], name="g")
        assert one.value.attempts[0].rejected_by == "domain"
        assert two.value.attempts[0].rejected_by == "anonymous"

    async def test_validation_error_in_a_check_is_a_rejection_by_that_check(self):
        class Positive(BaseModel):
            x: float

            @field_validator("x")
            @classmethod
            def positive(cls, v: float) -> float:
                if v <= 0:
                    raise ValueError("must be positive")
                return v

        def validated(value):
            Positive(x=value)

        outcome = await accept(producing(-1.0, 2.0), checks=[validated], attempts=2, name="g")
        first = outcome.attempts[0]
        assert first.rejected_by == "validated"
        assert "x" in first.reason
        assert "must be positive" in first.reason
        assert "-1.0" not in first.reason  # input values stay out of reasons

    async def test_every_check_that_ran_leaves_a_verdict(self):
        def one(value):
            return None

        def two(value):
            raise Rejected("two says no")

        def three(value):
            return None

        with pytest.raises(NotAccepted) as caught:
            await accept(producing(1), checks=[one, two, three], name="g")
        verdicts = caught.value.attempts[0].verdicts
        assert [(v.check, v.passed) for v in verdicts] == [("one", True), ("two", False)]
        assert verdicts[1].reason == "two says no"
        assert all(v.duration >= 0 for v in verdicts)

    async def test_what_a_check_reports_is_its_verdicts_details(self):
        def passes(value):
            return {"ran_on": "job 12"}

        def refuses(value):
            raise Rejected("too big", details={"ran_on": "job 13"})

        def silent(value):
            return "not a mapping"  # only a mapping counts as details

        with pytest.raises(NotAccepted) as caught:
            await accept(producing(1), checks=[silent, passes, refuses], name="g")
        verdicts = caught.value.attempts[0].verdicts
        assert [v.details for v in verdicts] == [None, {"ran_on": "job 12"}, {"ran_on": "job 13"}]
        dumped = json.loads(caught.value.attempts[0].model_dump_json())
        assert dumped["verdicts"][1]["details"] == {"ran_on": "job 12"}

    async def test_sync_and_async_checks_mix(self):
        async def async_check(value):
            await asyncio.sleep(0)
            if value == 1:
                raise Rejected("async no")

        outcome = await accept(
            producing(1, 4), checks=[reject_below(0), async_check], attempts=2, name="g"
        )
        assert outcome.value == 4
        assert outcome.attempts[0].rejected_by == "async_check"


class TestProducer:
    async def test_async_producer(self):
        async def producer(previous):
            await asyncio.sleep(0)
            return len(previous) + 10

        outcome = await accept(producer, name="g")
        assert outcome.value == 10

    async def test_producer_rejection_names_its_stage_and_has_no_value(self):
        def producer(previous):
            if not previous:
                raise Rejected("the model refused", check="refusal")
            return 3

        outcome = await accept(producer, attempts=2, name="g")
        first = outcome.attempts[0]
        assert (first.rejected_by, first.reason, first.value) == (
            "refusal",
            "the model refused",
            None,
        )
        assert outcome.value == 3

    async def test_producer_validation_error_is_a_schema_rejection(self):
        class Decision(BaseModel):
            count: int

        def producer(previous):
            if not previous:
                return Decision.model_validate({"count": "many"})
            return Decision(count=2)

        outcome = await accept(producer, attempts=2, name="g")
        assert outcome.attempts[0].rejected_by == "schema"
        assert "count" in outcome.attempts[0].reason
        assert outcome.value == Decision(count=2)

    async def test_producer_failure_propagates_without_fallback_or_retry(self):
        calls = []

        def producer(previous):
            calls.append(previous)
            raise BoomError("provider down")

        fallback_calls = []
        with pytest.raises(BoomError):
            await accept(producer, attempts=3, fallback=lambda: fallback_calls.append(1), name="g")
        assert len(calls) == 1
        assert fallback_calls == []

    async def test_check_failure_propagates_at_once(self):
        def broken(value):
            raise BoomError("verifier crashed")

        with pytest.raises(BoomError):
            await accept(producing(1, 2), checks=[broken], attempts=2, fallback=lambda: 0, name="g")

    async def test_a_failing_check_hands_its_attempt_to_the_hook_before_propagating(self):
        class CrashedError(RuntimeError):
            def __init__(self) -> None:
                super().__init__("task v/0 ended failed (task_failed)")
                self.details = {"exit_code": 3, "stderr_tail": "solver diverged"}

        def passes(value):
            return None

        def broken(value):
            raise CrashedError

        handed: list[Attempt] = []

        async def record(attempt):
            handed.append(attempt)

        with pytest.raises(CrashedError):
            await accept(
                producing(1, 2),
                checks=[passes, broken],
                attempts=2,
                name="g",
                on_failed_attempt=record,
            )
        [failed] = handed
        assert (failed.number, failed.value, failed.rejected_by, failed.failed_by) == (
            1,
            1,
            None,
            "broken",
        )
        assert not failed.accepted
        assert failed.reason == "CrashedError: task v/0 ended failed (task_failed)"
        assert [(v.check, v.passed) for v in failed.verdicts] == [
            ("passes", True),
            ("broken", False),
        ]
        assert failed.verdicts[-1].details == {"exit_code": 3, "stderr_tail": "solver diverged"}

    async def test_a_failing_producer_hands_its_valueless_attempt_to_the_hook(self):
        class EndpointDownError(RuntimeError):
            def __init__(self) -> None:
                super().__init__("model endpoint refused the connection")
                self.details = {"status_code": 503}

        def rejected_once_then_down(previous):
            if not previous:
                raise Rejected("a refusal", check="refusal")
            raise EndpointDownError

        handed: list[Attempt] = []
        with pytest.raises(EndpointDownError):
            await accept(
                rejected_once_then_down, attempts=3, name="g", on_failed_attempt=handed.append
            )
        [failed] = handed
        assert (failed.number, failed.value, failed.rejected_by, failed.failed_by) == (
            2,
            None,
            None,
            "producer",
        )
        assert failed.reason == "EndpointDownError: model endpoint refused the connection"
        [verdict] = failed.verdicts
        assert (verdict.check, verdict.passed, verdict.details) == (
            "producer",
            False,
            {"status_code": 503},
        )

    async def test_a_rejection_never_reaches_the_failed_attempt_hook(self):
        handed: list[Attempt] = []
        with pytest.raises(NotAccepted):
            await accept(
                producing(-1), checks=[reject_below(0)], name="g", on_failed_attempt=handed.append
            )
        assert handed == []


class TestFallback:
    async def test_fallback_value_is_used_unchecked_after_the_budget(self):
        ran = []

        def strict(value):
            ran.append(value)
            raise Rejected("never good enough")

        outcome = await accept(
            producing(1, 2), checks=[strict], attempts=2, fallback=lambda: -5, name="g"
        )
        assert outcome.value == -5
        assert outcome.disposition == "fallback"
        assert len(outcome.attempts) == 2
        assert ran == [1, 2]  # the fallback was not checked

    async def test_async_fallback(self):
        async def fallback():
            return "safe"

        outcome = await accept(producing(1), checks=[reject_below(5)], fallback=fallback, name="g")
        assert outcome.value == "safe"

    async def test_fallback_failure_propagates(self):
        def fallback():
            raise ValueError("bounds too narrow")

        with pytest.raises(ValueError, match="too narrow"):
            await accept(producing(1), checks=[reject_below(5)], fallback=fallback, name="g")

    async def test_not_accepted_carries_every_attempt_and_no_value_in_message(self):
        producer = producing("secret-one", "secret-two")

        def never(value):
            raise Rejected("no")

        with pytest.raises(NotAccepted) as caught:
            await accept(producer, checks=[never], attempts=2, name="planner")
        error = caught.value
        assert [a.value for a in error.attempts] == ["secret-one", "secret-two"]
        assert "secret" not in str(error)
        assert "planner" in str(error)


class TestScores:
    async def test_scores_are_recorded_on_accepted_values_and_never_gate(self):
        def judge(value):
            return 0.0  # the worst score does not reject

        async def other(value):
            return value / 10

        outcome = await accept(
            producing(1, 5), checks=[reject_below(3)], attempts=2, scores=[judge, other], name="g"
        )
        assert outcome.disposition == "accepted"
        assert outcome.attempts[0].scores == {}  # rejected values are not scored
        assert outcome.attempts[1].scores == {"judge": 0.0, "other": 0.5}


class TestRecords:
    async def test_outcome_and_attempts_are_immutable(self):
        outcome = await accept(producing(1), name="g")
        with pytest.raises(ValidationError):
            outcome.value = 2  # type: ignore[misc]
        with pytest.raises(ValidationError):
            outcome.attempts[0].reason = "x"  # type: ignore[misc]

    async def test_outcome_round_trips_through_json(self):
        class Plan(BaseModel):
            # NaN must survive the record: JSON has no NaN, so it is written as a string.
            model_config = ConfigDict(ser_json_inf_nan="strings")
            candidates: list[float]

        def finite(plan: Plan) -> None:
            if not all(math.isfinite(x) for x in plan.candidates):
                raise Rejected("a candidate is not finite")

        outcome = await accept(
            producing(Plan(candidates=[math.nan]), Plan(candidates=[0.5])),
            checks=[finite],
            attempts=2,
            name="g",
        )
        data = json.loads(outcome.model_dump_json())
        assert data["disposition"] == "accepted"
        assert data["value"] == {"candidates": [0.5]}
        restored = Outcome[Plan].model_validate(data)
        assert restored.value == Plan(candidates=[0.5])
        assert restored.attempts[0].rejected_by == "finite"
        assert math.isnan(restored.attempts[0].value.candidates[0])


class TestCancellation:
    async def test_cancelling_the_caller_cancels_the_attempt_in_flight(self):
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def slow_producer(previous):
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return 1

        task = asyncio.create_task(accept(slow_producer, fallback=lambda: 0, name="g"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cancelled.is_set()
