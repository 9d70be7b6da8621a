"""Simulation batches: stable idempotency keys, and a finished batch is never run again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tasks import (
    AllocationExecutor,
    BatchStore,
    ExecutableTask,
    FunctionTask,
    MemoryBatchStore,
    Simulation,
    SiteConfig,
    TaskResult,
    batch_key,
    launch_batch,
)

CANDIDATES = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]


def local_site() -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "name": "test-batch",
            "backend": {"kind": "local", "executor": "thread", "max_workers": 2},
            "cost": {"node_hours_per_simulation": 0.1},
            "retry_backoff": 0.0,
        }
    )


class TestBatchKey:
    def test_the_key_is_a_sha256_hex_digest(self) -> None:
        key = batch_key("camp", 1, CANDIDATES, "sim")
        assert len(key) == 64
        assert int(key, 16) >= 0

    def test_the_key_is_the_same_in_another_process(self) -> None:
        program = f"from tasks import batch_key; print(batch_key('camp', 1, {CANDIDATES!r}, 'sim'))"
        other = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
        )
        assert other.stdout.strip() == batch_key("camp", 1, CANDIDATES, "sim")

    def test_integers_and_floats_name_the_same_candidate(self) -> None:
        assert batch_key("c", 0, [[1, 2]], "s") == batch_key("c", 0, [[1.0, 2.0]], "s")

    @pytest.mark.parametrize(
        ("campaign", "round_index", "candidates", "simulation"),
        [
            ("other", 1, CANDIDATES, "sim"),
            ("camp", 2, CANDIDATES, "sim"),
            ("camp", 1, CANDIDATES[::-1], "sim"),
            ("camp", 1, CANDIDATES[:2], "sim"),
            ("camp", 1, CANDIDATES, "sim-v2"),
        ],
        ids=["campaign", "round", "order", "count", "simulation"],
    )
    def test_any_change_gives_another_key(
        self, campaign: str, round_index: int, candidates: list[list[float]], simulation: str
    ) -> None:
        assert batch_key(campaign, round_index, candidates, simulation) != batch_key(
            "camp", 1, CANDIDATES, "sim"
        )

    def test_a_nan_candidate_is_refused(self) -> None:
        with pytest.raises(ValueError, match="candidate 1"):
            batch_key("c", 0, [[0.0], [float("nan")]], "s")


class TestMemoryBatchStore:
    def test_it_is_a_batch_store(self) -> None:
        assert isinstance(MemoryBatchStore(), BatchStore)

    def test_an_unknown_batch_has_no_results(self) -> None:
        assert MemoryBatchStore().find_batch("nope") is None

    def test_recording_twice_keeps_the_first_record(self) -> None:
        store = MemoryBatchStore()
        first = [TaskResult(index=0, key="k/0-a", status="done", runtime=0.0, host="h", attempts=1)]
        second = [
            TaskResult(index=0, key="k/0-b", status="failed", runtime=0.0, host="h", attempts=1)
        ]
        store.record_batch_launched(
            "k", campaign="c", round_index=0, candidates=[[1.0]], backend="local"
        )
        store.record_batch_launched("k", campaign="c", round_index=9, candidates=[], backend="dask")
        store.record_batch_results("k", first)
        store.record_batch_results("k", second)
        assert store.launched["k"]["round_index"] == 0
        assert store.find_batch("k") == first


class TestSimulation:
    def test_an_executable_simulation_gets_the_candidate_as_json_on_stdin(self) -> None:
        simulation = Simulation.executable(["solver", "--round", "{round}", "--i", "{index}"])
        task = simulation.task_for([0.5, 1.0], index=4, campaign="c", round_index=2)
        assert isinstance(task, ExecutableTask)
        assert task.argv == ["solver", "--round", "2", "--i", "4"]
        assert json.loads(task.stdin or b"") == [0.5, 1.0]

    def test_an_executable_simulation_is_named_by_its_argv(self) -> None:
        assert Simulation.executable(["a"]).id == Simulation.executable(["a"]).id
        assert Simulation.executable(["a"]).id != Simulation.executable(["b"]).id

    def test_a_function_simulation_calls_the_function_with_the_candidate(self) -> None:
        task = Simulation.function(sum, id="sum").task_for(
            [1.0, 2.0], index=0, campaign="c", round_index=0
        )
        assert isinstance(task, FunctionTask)
        assert task.fn(*task.args) == 3.0

    def test_a_simulation_needs_exactly_one_of_argv_and_fn(self) -> None:
        with pytest.raises(ValueError, match="exactly one"):
            Simulation(id="x")


class TestLaunchBatch:
    @pytest.mark.asyncio
    async def test_a_new_batch_runs_and_is_recorded(self) -> None:
        store = MemoryBatchStore()
        simulation = Simulation.function(sum, id="sum")
        async with AllocationExecutor.from_site(local_site()) as executor:
            outcome = await launch_batch(
                executor,
                store,
                campaign="c",
                round_index=1,
                candidates=CANDIDATES,
                simulation=simulation,
            )
        assert outcome.reused is False
        assert [r.value for r in outcome.results] == pytest.approx([0.3, 0.7, 1.1])
        assert store.launched[outcome.key]["backend"] == "local"
        assert store.find_batch(outcome.key) == outcome.results

    @pytest.mark.asyncio
    async def test_a_finished_batch_is_reused_without_running_anything(
        self, tmp_path: Path
    ) -> None:
        ran = tmp_path / "ran"
        simulation = Simulation.executable(["sh", "-c", f"echo run >> {ran}; cat"], id="counting")
        store = MemoryBatchStore()
        launches: list[Any] = []
        async with AllocationExecutor.from_site(local_site()) as executor:
            for _ in range(2):
                launches.append(
                    await launch_batch(
                        executor,
                        store,
                        campaign="c",
                        round_index=1,
                        candidates=CANDIDATES,
                        simulation=simulation,
                    )
                )
        first, second = launches
        assert (first.reused, second.reused) == (False, True)
        assert second.key == first.key
        assert second.results == first.results
        assert ran.read_text().count("run") == len(CANDIDATES)
        assert [r.value for r in first.results] == CANDIDATES

    @pytest.mark.asyncio
    async def test_failed_simulations_are_results_not_exceptions(self) -> None:
        simulation = Simulation.executable(["sh", "-c", "exit 4"], id="broken")
        store = MemoryBatchStore()
        seen: list[int] = []
        async with AllocationExecutor.from_site(local_site()) as executor:
            outcome = await launch_batch(
                executor,
                store,
                campaign="c",
                round_index=0,
                candidates=CANDIDATES,
                simulation=simulation,
                on_result=lambda r: seen.append(r.index),
            )
        assert [r.status for r in outcome.results] == ["failed"] * 3
        assert [r.exit_code for r in outcome.results] == [4, 4, 4]
        assert sorted(seen) == [0, 1, 2]
        assert store.find_batch(outcome.key) is not None
