"""What a campaign's recorded allocations used of its budget, over all its runs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tasks import AllocationRecord, TaskResult

T0 = 1_800_000_000.0
HOUR = 3600.0


def _job(job: str, request: int, requested_at: float, **changes: Any) -> AllocationRecord:
    return AllocationRecord(job_id=job, request=request, requested_at=requested_at, **changes)


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


@pytest.fixture
def campaign(store: Any) -> str:
    store.ensure_campaign("c", spec={}, site="slurm-local", seed=1, code_version="t")
    return "c"


class TestAllocationUsage:
    def test_an_unknown_campaign_used_nothing(self, store: Any) -> None:
        usage = store.allocation_usage("nobody")
        assert (usage.requests, usage.node_hours) == (0, 0.0)

    def test_requests_of_runs_that_each_counted_from_one_are_all_counted(
        self, store: Any, campaign: str
    ) -> None:
        """Rows written before the count was the campaign's restart at request 1 in each run."""
        store.record_allocations(campaign, [_job("11", 1, T0), _job("12", 1, T0)])  # one request
        store.record_allocations(campaign, [_job("13", 1, T0 + 60)])  # the next run's first
        store.record_allocations(campaign, [_job("14", 2, T0 + 120)])
        assert store.allocation_usage(campaign, _at(T0 + 200)).requests == 3

    def test_ended_jobs_are_charged_nodes_times_hours_from_start_to_end(
        self, store: Any, campaign: str
    ) -> None:
        ended = _job("21", 1, T0, state="TIMEOUT", started_at=T0, ended_at=T0 + HOUR, node_count=2)
        never_started = _job("22", 2, T0 + HOUR, state="CANCELLED", end_reason="cancelled")
        store.record_allocations(campaign, [ended, never_started])
        usage = store.allocation_usage(campaign, _at(T0 + 10 * HOUR))
        assert usage.node_hours == pytest.approx(2.0)

    def test_a_job_a_crashed_run_left_open_counts_until_its_planned_end_or_now(
        self, store: Any, campaign: str
    ) -> None:
        open_job = _job("31", 1, T0, state="RUNNING", started_at=T0, ends_at=T0 + 2 * HOUR)
        store.record_allocations(campaign, [open_job])
        assert store.allocation_usage(campaign, _at(T0 + HOUR)).node_hours == pytest.approx(1.0)
        assert store.allocation_usage(campaign, _at(T0 + 5 * HOUR)).node_hours == pytest.approx(2.0)


class TestProgress:
    def test_progress_counts_completed_rounds_and_results_not_interrupted(
        self, store: Any, campaign: str
    ) -> None:
        assert store.progress(campaign) == store.progress("nobody")
        store.start_round(campaign, 0)
        key = "c/0/abc"
        store.record_batch_launched(
            key, campaign=campaign, round_index=0, candidates=[[0.1], [0.2]], backend="local"
        )
        results = [
            TaskResult(
                index=0,
                key="t0",
                status="done",
                value={"value": 1.0},
                runtime=1.0,
                host="n1",
                attempts=1,
            ),
            TaskResult(
                index=1,
                key="t1",
                status="interrupted",
                runtime=1.0,
                host="n1",
                attempts=1,
                error_code="allocation_ended",
            ),
        ]
        store.record_batch_results(key, results)
        progress = store.progress(campaign)
        assert (progress.rounds, progress.tasks) == (0, 1)
