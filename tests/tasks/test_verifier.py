"""Verifier checks: a judge's reason rejects, a failed verifier task is a failure, spans nest."""

from __future__ import annotations

from typing import Any

import pytest

from acceptance import accept
from policies import VerifierFailed
from tasks import AllocationExecutor, ExecutableTask, FunctionTask, SiteConfig, TaskResult, verifier

LIMIT = 1.0


def predicted_energy(x: float) -> float:
    return 4.0 * x * x


def judge_energy(x: float, result: TaskResult) -> str | None:
    if result.value > LIMIT:
        return f"predicted energy {result.value:.2g} above the limit {LIMIT:g} at x={x:g}"
    return None


def local_site() -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "name": "test-verifier",
            "backend": {"kind": "local", "executor": "thread", "max_workers": 2},
            "cost": {"node_hours_per_simulation": 0.1},
            "retries": 0,
        }
    )


def proposals(*values: float) -> Any:
    def producer(previous: tuple[Any, ...]) -> float:
        return values[len(previous)]

    return producer


class TestVerifier:
    @pytest.mark.asyncio
    async def test_a_value_the_judge_passes_is_accepted(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            check = verifier(
                executor,
                task_for=lambda x: FunctionTask(predicted_energy, (x,)),
                judge=judge_energy,
            )
            outcome = await accept(proposals(0.25), checks=[check], name="design")
        assert outcome.disposition == "accepted"
        assert outcome.attempts[0].verdicts[0].check == "verifier"

    @pytest.mark.asyncio
    async def test_a_judge_reason_rejects_and_is_recorded_on_the_attempt(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            check = verifier(
                executor,
                task_for=lambda x: FunctionTask(predicted_energy, (x,)),
                judge=judge_energy,
                name="energy",
            )
            outcome = await accept(proposals(0.7, 0.2), checks=[check], attempts=2, name="design")
        first, second = outcome.attempts
        assert first.rejected_by == "energy"
        assert first.reason == "predicted energy 2 above the limit 1 at x=0.7"
        assert second.accepted
        assert outcome.value == 0.2
        # Both verdicts say where the verifier's task ran (no batch job here).
        for attempt in (first, second):
            (verdict,) = attempt.verdicts
            assert verdict.details is not None
            (task,) = verdict.details["tasks"]
            assert task["status"] == "done"
            assert task["key"].startswith("verifier/energy/")
            assert task["host"]
            assert task["job_id"] is None
            assert verdict.details["job_ids"] == []

    @pytest.mark.asyncio
    async def test_a_failed_verifier_task_is_a_failure_not_a_rejection(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            check = verifier(
                executor,
                task_for=lambda x: ExecutableTask(["sh", "-c", "exit 9"]),
                judge=judge_energy,
                name="energy",
            )
            with pytest.raises(VerifierFailed) as caught:
                await accept(proposals(0.1, 0.2), checks=[check], attempts=2, name="design")
        assert caught.value.code == "verifier_failed"
        assert caught.value.details["status"] == "failed"
        assert caught.value.details["exit_code"] == 9

    @pytest.mark.asyncio
    async def test_a_list_of_tasks_is_judged_on_all_its_results(self) -> None:
        def judge_all(xs: list[float], results: list[TaskResult]) -> str | None:
            worst = max(results, key=lambda r: r.value)
            return None if worst.value <= LIMIT else f"candidate {worst.index} above the limit"

        async with AllocationExecutor.from_site(local_site()) as executor:
            check = verifier(
                executor,
                task_for=lambda xs: [FunctionTask(predicted_energy, (x,)) for x in xs],
                judge=judge_all,
            )
            outcome = await accept(
                proposals([0.1, 0.9, 0.2], [0.1, 0.2]),  # type: ignore[arg-type]
                checks=[check],
                attempts=2,
                name="batch",
            )
        assert outcome.attempts[0].reason == "candidate 1 above the limit"
        assert outcome.value == [0.1, 0.2]

    @pytest.mark.asyncio
    async def test_the_verifier_span_is_a_child_of_the_attempt_span(self, otel: Any) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            check = verifier(
                executor,
                task_for=lambda x: FunctionTask(predicted_energy, (x,)),
                judge=judge_energy,
                name="energy",
            )
            await accept(proposals(0.7, 0.2), checks=[check], attempts=2, name="design")
        # `otel` (tests/conftest.py) owns the global SDK providers, settable once.
        finished = otel.spans()
        attempts = [s for s in finished if s.name == "accept.attempt design"]
        verifiers = [s for s in finished if s.name == "verifier energy"]
        assert len(attempts) == 2
        assert len(verifiers) == 2
        for attempt, verifier_span in zip(attempts, verifiers, strict=True):
            assert verifier_span.parent is not None
            assert verifier_span.parent.span_id == attempt.context.span_id
            assert verifier_span.context.trace_id == attempt.context.trace_id
        assert verifiers[0].attributes["unattended.verifier.passed"] is False
        assert verifiers[1].attributes["unattended.verifier.passed"] is True
