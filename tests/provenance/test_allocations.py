"""Allocations (Slurm jobs) and interrupted tasks in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flows._cli._progress import read_queue
from policies import ValidationFailed
from tasks import AllocationRecord, TaskResult

STARTED = 1_800_000_000.0


def _record(job: str, request: int = 1, **changes: Any) -> AllocationRecord:
    base: dict[str, Any] = {"job_id": job, "request": request, "requested_at": STARTED - 5}
    return AllocationRecord(**{**base, **changes})


def _result(index: int, status: str, job: str | None) -> TaskResult:
    return TaskResult(
        index=index,
        key=f"k/{index}",
        status=status,  # type: ignore[arg-type]  # the literal is checked by pydantic
        value={"value": float(index)} if status == "done" else None,
        runtime=1.0,
        host="node1",
        job_id=job,
        attempts=1,
        error_code="allocation_ended" if status == "interrupted" else None,
    )


@pytest.fixture
def campaign(store: Any) -> str:
    store.ensure_campaign("c", spec={}, site="slurm-local", seed=1, code_version="t")
    return "c"


class TestAllocationRows:
    def test_a_job_is_inserted_then_updated_as_it_runs_and_ends(
        self, store: Any, campaign: str
    ) -> None:
        store.record_allocations(campaign, [_record("12", reason="Resources")])
        (waiting,) = store.allocations(campaign)
        assert (waiting["state"], waiting["reason"], waiting["started_at"]) == (
            "PENDING",
            "Resources",
            None,
        )
        store.record_allocations(
            campaign,
            [
                _record(
                    "12",
                    state="TIMEOUT",
                    reason="TimeLimit",
                    nodes=("node1",),
                    node_count=1,
                    started_at=STARTED,
                    ends_at=STARTED + 60,
                    ended_at=STARTED + 80,
                    end_reason="timeout",
                )
            ],
        )
        (ended,) = store.allocations(campaign)
        assert ended["end_reason"] == "timeout"
        assert ended["nodes"] == ["node1"]
        assert ended["started_at"] == datetime.fromtimestamp(STARTED, UTC).isoformat()

    def test_an_unknown_end_reason_is_refused(self, store: Any, campaign: str) -> None:
        with pytest.raises(ValidationFailed):
            store.record_allocations(campaign, [{"job_id": "1", "end_reason": "vanished"}])

    def test_the_queue_line_names_the_latest_request_s_pending_jobs(
        self, store: Any, campaign: str
    ) -> None:
        assert read_queue(store, campaign) == ""
        store.record_allocations(
            campaign,
            [
                _record("12", state="CANCELLED", end_reason="cancelled"),
                _record("13", request=2, reason="Resources"),
            ],
        )
        assert read_queue(store, campaign) == "waiting in queue: job 13 PENDING (Resources)"
        store.record_allocations(campaign, [_record("13", request=2, state="RUNNING")])
        assert read_queue(store, campaign) == ""


class TestTasksInAllocations:
    def test_results_carry_their_job_and_its_window_and_interruptions_count_apart(
        self, store: Any, campaign: str
    ) -> None:
        store.record_allocations(
            campaign,
            [
                _record("12", state="CANCELLED", started_at=STARTED, ends_at=STARTED + 60,
                        ended_at=STARTED + 20, end_reason="cancelled"),
                _record("13", request=2, state="RUNNING", started_at=STARTED + 30,
                        ends_at=STARTED + 90),
            ],
        )  # fmt: skip
        store.record_batch_launched(
            "b0", campaign=campaign, round_index=0, candidates=[[0.0], [1.0]], backend="dask"
        )
        store.record_batch_results(
            "b0", [_result(0, "done", "12"), _result(1, "interrupted", "12")]
        )
        store.record_batch_launched(
            "b1", campaign=campaign, round_index=0, candidates=[[1.0]], backend="dask", relaunch=1
        )
        store.record_batch_results("b1", [_result(0, "done", "13")])
        (relaunched,) = store.find_batch("b1")
        assert relaunched.job_id == "13"
        assert relaunched.allocation_start == datetime.fromtimestamp(STARTED + 30, UTC)
        assert relaunched.allocation_end == datetime.fromtimestamp(STARTED + 90, UTC)
        first = store.find_batch("b0")
        assert [r.status for r in first] == ["done", "interrupted"]
        (round_,) = store.summary(campaign)["rounds"]
        assert (round_["tasks"], round_["done"], round_["interruptions"]) == (2, 2, 1)
        batches = store.round_view(campaign, 0)["batches"]
        assert [b["relaunch"] for b in batches] == [0, 1]

    def test_results_recorded_before_the_job_s_start_was_known_get_its_window_then(
        self, store: Any, campaign: str
    ) -> None:
        """Short tasks can finish before ``squeue`` is next asked when their job started."""
        store.record_allocations(campaign, [_record("14", state="PENDING")])
        store.record_batch_launched(
            "b0", campaign=campaign, round_index=0, candidates=[[0.0], [1.0]], backend="dask"
        )
        store.record_batch_results("b0", [_result(0, "done", "14"), _result(1, "done", "15")])
        assert [r.allocation_start for r in store.find_batch("b0")] == [None, None]
        store.record_allocations(
            campaign, [_record("14", state="RUNNING", started_at=STARTED, ends_at=STARTED + 60)]
        )
        first, other = store.find_batch("b0")
        assert first.allocation_start == datetime.fromtimestamp(STARTED, UTC)
        assert first.allocation_end == datetime.fromtimestamp(STARTED + 60, UTC)
        assert other.allocation_start is None  # another job's result is left alone
