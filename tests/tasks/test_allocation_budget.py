"""The allocation budget is the campaign's: a watch starts from what earlier runs used."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence

import pytest

from policies import BudgetExceeded
from tasks import BudgetUsed, retire_left_open
from tasks import _allocations as allocations
from tasks import _left_open as left_open_jobs
from tasks._allocations import AllocationWatch
from tasks._slurm import AllocationState

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _queue_knows_every_job_as_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    """No scheduler here: every job asked about is pending (squeue's answer, without squeue)."""

    def query_jobs(
        job_ids: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> dict[str, AllocationState]:
        return {j: AllocationState(job_id=j, state="PENDING", reason="Priority") for j in job_ids}

    monkeypatch.setattr(allocations, "query_jobs", query_jobs)
    monkeypatch.setattr(left_open_jobs, "query_jobs", query_jobs)


def _watch(**limits: object) -> tuple[AllocationWatch, list[str]]:
    submitted: list[str] = []
    numbers = itertools.count(100)

    async def submit() -> list[str]:
        job = str(next(numbers))
        submitted.append(job)
        return [job]

    return AllocationWatch(submit, env={}, poll_seconds=60, **limits), submitted  # type: ignore[arg-type]  # limits are the watch's keywords


class TestBudgetUsed:
    def test_requests_of_earlier_runs_count_toward_max_allocations(self) -> None:
        watch, submitted = _watch(max_allocations=3, used=BudgetUsed(requests=2))

        async def run() -> None:
            await watch.request()
            with pytest.raises(BudgetExceeded, match=r"3 of scheduler.max_allocations=3") as caught:
                await watch.request()
            assert caught.value.details["earlier_runs"] == 2
            assert caught.value.code == "budget_exceeded"

        asyncio.run(run())
        assert submitted == ["100"]  # one job only: the budget's last allocation

    def test_a_campaign_that_used_its_allocations_gets_none_in_a_new_process(self) -> None:
        watch, submitted = _watch(max_allocations=2, used=BudgetUsed(requests=2))
        with pytest.raises(BudgetExceeded, match="max_allocations"):
            asyncio.run(watch.request())
        assert submitted == []

    def test_requests_are_numbered_for_the_campaign(self) -> None:
        watch, _ = _watch(used=BudgetUsed(requests=4))
        records = asyncio.run(watch.request())
        assert [r.request for r in records] == [5]
        assert watch.requests == 5

    def test_node_hours_of_earlier_runs_count_toward_max_node_hours(self) -> None:
        watch, submitted = _watch(max_node_hours=8.0, used=BudgetUsed(node_hours=8.0))
        with pytest.raises(BudgetExceeded, match=r"scheduler.max_node_hours=8") as caught:
            asyncio.run(watch.request())
        assert caught.value.details["earlier_runs"] == 8.0
        assert submitted == []

    def test_without_earlier_runs_the_budget_is_this_watch_s(self) -> None:
        watch, submitted = _watch(max_allocations=1)
        asyncio.run(watch.request())
        assert watch.node_hours() == 0.0
        assert submitted == ["100"]


class TestRetireLeftOpen:
    def test_live_jobs_are_cancelled_ended_ones_take_slurm_s_end_forgotten_ones_unknown(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        states = {
            "1": AllocationState(job_id="1", state="RUNNING", started_at=100.0, ends_at=700.0),
            "2": AllocationState(job_id="2", state="TIMEOUT", started_at=100.0, ends_at=160.0),
        }
        cancelled: list[str] = []
        monkeypatch.setattr(left_open_jobs, "query_jobs", lambda ids, env=None: states)
        monkeypatch.setattr(
            left_open_jobs, "cancel_jobs", lambda ids, env=None: cancelled.extend(ids)
        )
        left_open = [
            allocations.AllocationRecord(job_id=j, request=1, requested_at=90.0, ends_at=200.0)
            for j in ("1", "2", "3")
        ]
        done = allocations.AllocationRecord(
            job_id="4", request=1, requested_at=90.0, end_reason="released"
        )
        ended = retire_left_open([*left_open, done], env={})
        assert cancelled == ["1"]
        assert [(r.job_id, r.end_reason) for r in ended] == [
            ("1", "released"),
            ("2", "timeout"),
            ("3", "unknown"),
        ]
        assert ended[1].ended_at == 160.0
        assert ended[2].ended_at == 200.0  # forgotten: charged until its planned end at most
        assert all(r.request == 1 for r in ended)  # the earlier run's numbering is kept
