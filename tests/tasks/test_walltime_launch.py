"""Walltime-aware launches: nothing goes into an allocation that cannot finish one task of it.

``AllocationExecutor.ensure_time`` is judged against a watch whose time left is
set by the test (the site's walltime is slurm-local's 10 minutes); the Slurm
suite runs the same decisions against real jobs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from policies import DeadlineExceeded
from tasks import AllocationExecutor, load_site

WALLTIME = 600.0  # site-configs/slurm-local.toml: walltime = "00:10:00"


class _Watch:
    """The executor's view of its allocation: time left, lost, and requests made."""

    def __init__(self, left: float | None, *, lost: bool = False) -> None:
        self.left = left
        self.is_lost = lost
        self.requests = 0

    def seconds_left(self) -> float | None:
        return self.left

    async def request(self) -> list[Any]:
        self.requests += 1
        self.is_lost = False
        self.left = None  # the fresh job is queued: its whole walltime is ahead
        return []


def _executor(watch: _Watch) -> AllocationExecutor:
    site = load_site("slurm-local", env={})
    assert site.scheduler.walltime_seconds == WALLTIME
    executor = AllocationExecutor(site)
    executor._watch = watch  # type: ignore[assignment]  # the watch's surface, set by the test
    executor._parts = object()  # type: ignore[assignment]  # entered, as far as requests go
    return executor


def _ensure(watch: _Watch, seconds: float, unit: float | None = None) -> bool:
    return asyncio.run(_executor(watch).ensure_time(seconds, unit=unit))


class TestEnsureTime:
    def test_work_that_fits_in_what_is_left_is_launched_here(self) -> None:
        watch = _Watch(left=300.0)
        assert _ensure(watch, 200.0, unit=50.0) is False
        assert watch.requests == 0

    def test_work_a_fresh_allocation_holds_waits_for_the_next(self) -> None:
        watch = _Watch(left=100.0)
        assert _ensure(watch, 200.0, unit=50.0) is True
        assert watch.requests == 1

    def test_work_longer_than_the_walltime_is_split_when_one_task_fits(self) -> None:
        watch = _Watch(left=100.0)
        assert _ensure(watch, 3 * WALLTIME, unit=60.0) is False
        assert watch.requests == 0

    def test_work_longer_than_the_walltime_is_not_launched_past_the_end(self) -> None:
        """The issue's case: a batch started 10 s after its job's planned end."""
        watch = _Watch(left=0.0)
        assert _ensure(watch, 3 * WALLTIME, unit=60.0) is True
        assert watch.requests == 1

    def test_work_longer_than_the_walltime_waits_when_not_one_task_fits(self) -> None:
        watch = _Watch(left=30.0)
        assert _ensure(watch, 3 * WALLTIME, unit=60.0) is True
        assert watch.requests == 1

    def test_a_task_longer_than_the_walltime_is_refused_before_any_request(self) -> None:
        watch = _Watch(left=None, lost=True)
        with pytest.raises(DeadlineExceeded, match=r"longer than scheduler.walltime") as caught:
            _ensure(watch, 2 * WALLTIME, unit=WALLTIME + 1)
        assert caught.value.details["field"] == "scheduler.walltime"
        assert watch.requests == 0

    def test_without_a_unit_the_whole_work_is_one_task(self) -> None:
        with pytest.raises(DeadlineExceeded):
            _ensure(_Watch(left=100.0), WALLTIME + 1)

    def test_a_queued_job_has_its_whole_walltime_ahead(self) -> None:
        watch = _Watch(left=None)
        assert _ensure(watch, 3 * WALLTIME, unit=60.0) is False
        assert watch.requests == 0

    def test_an_ended_allocation_is_renewed(self) -> None:
        watch = _Watch(left=0.0, lost=True)
        assert _ensure(watch, 10.0) is True
        assert watch.requests == 1

    def test_a_site_without_jobs_of_its_own_launches_at_once(self) -> None:
        executor = AllocationExecutor(load_site("local", env={}))
        assert asyncio.run(executor.ensure_time(10 * WALLTIME, unit=5 * WALLTIME)) is False


class TestPilotRuntime:
    """A RADICAL-Pilot pilot ends at its ``runtime_minutes``, whatever the job's walltime.

    The launcher judges against the shorter of the two, as ``unattended check`` does.
    """

    @staticmethod
    def _pilot_executor(watch: _Watch, *, runtime_minutes: int) -> AllocationExecutor:
        site = load_site("slurm-radical", env={})
        site = site.model_copy(
            update={"backend": site.backend.model_copy(update={"runtime_minutes": runtime_minutes})}
        )
        assert site.scheduler.walltime_seconds == 4 * 3600.0  # the job's, longer
        executor = AllocationExecutor(site)
        executor._watch = watch  # type: ignore[assignment]
        executor._parts = object()  # type: ignore[assignment]
        return executor

    def test_a_task_longer_than_the_pilot_is_refused_naming_its_runtime(self) -> None:
        watch = _Watch(left=None, lost=True)
        executor = self._pilot_executor(watch, runtime_minutes=10)
        with pytest.raises(DeadlineExceeded, match=r"longer than backend.runtime_minutes") as err:
            asyncio.run(executor.ensure_time(1200.0, unit=601.0))
        assert err.value.details == {
            "field": "backend.runtime_minutes",
            "seconds": 601.0,
            "walltime": 600.0,
        }
        assert watch.requests == 0

    def test_work_longer_than_the_pilot_is_split_by_the_pilot_not_the_job(self) -> None:
        # 30 min of work, 100 s left: against the job's 4 h it would wait for a fresh
        # allocation that holds it; against the pilot's 10 min no allocation holds it,
        # so it is split and launched here, one task fitting in what is left.
        watch = _Watch(left=100.0)
        executor = self._pilot_executor(watch, runtime_minutes=10)
        assert asyncio.run(executor.ensure_time(1800.0, unit=60.0)) is False
        assert watch.requests == 0
