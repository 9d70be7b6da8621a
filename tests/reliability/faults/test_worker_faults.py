"""Workers lost under a batch: a pool process that exits, a Dask worker killed mid-batch.

A lost worker is a transient failure: the executor retries the task (bounded) and
the batch's provenance keeps every retried attempt; a task that takes its worker
down every time ends as a failed task, and the batch's other tasks still finish.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows._provenance import ProvenanceStore
from tasks import AllocationExecutor, SiteConfig
from tasks._batch import Simulation, launch_batch

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

CANDIDATES = [[0.1, 0.1], [0.5, 0.5], [0.2, 0.7], [0.9, 0.3]]


def open_store(tmp_path: Path, name: str) -> ProvenanceStore:
    store = ProvenanceStore.open(tmp_path / "provenance")
    store.ensure_campaign(name, spec={}, site="faults", seed=1, code_version="test")
    store.start_round(name, 0)
    return store


class TestPoolWorkerExits:
    async def test_a_function_that_exits_its_pool_process_fails_alone(self, tmp_path):
        def simulate(candidate: list[float]) -> float:
            if candidate == [0.5, 0.5]:
                os._exit(1)  # the pool process dies under the task
            return sum(candidate)

        site = SiteConfig.model_validate(
            {
                "name": "pool",
                "backend": {"kind": "local", "executor": "process", "max_workers": 1},
                "cost": {"node_hours_per_simulation": 0.01},
                "max_concurrency": 1,
                "retries": 1,
                "retry_backoff": 0.0,
            }
        )
        store = open_store(tmp_path, "pool-exit")
        try:
            async with AllocationExecutor.from_site(site) as executor:
                outcome = await launch_batch(
                    executor,
                    store,
                    campaign="pool-exit",
                    round_index=0,
                    candidates=CANDIDATES,
                    simulation=Simulation.function(simulate, id="exits-on-centre"),
                )
            recorded = store.find_batch(outcome.key)
        finally:
            store.close()
        assert recorded is not None
        by_index = {r.index: r for r in recorded}
        lost = by_index[1]
        assert (lost.status, lost.error_code, lost.attempts) == ("failed", "task_failed", 2)
        assert [r["reason"] for r in lost.retries] == ["BrokenProcessPool"]  # as recorded
        assert [by_index[i].status for i in (0, 2, 3)] == ["done"] * 3


distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A two-worker LocalCluster on 127.0.0.1 (worker processes, restarted by their nannies)."""
    # With no allowed failures a task whose worker died comes back as KilledWorker at
    # once (the executor's transient failure), not after Dask's silent reschedules.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        local = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            processes=True,
        )
    try:
        yield local
    finally:
        local.close()


class TestDaskWorkerLost:
    async def test_a_worker_killed_mid_batch_costs_a_retry_not_a_result(self, cluster, tmp_path):
        started = tmp_path / "started"
        started.mkdir()

        def simulate(candidate: list[float]) -> float:
            # Say which worker runs this task, then work long enough to be killed.
            (started / f"{os.getpid()}-{candidate[0]}").write_text("")
            time.sleep(1.5)
            return sum(candidate)

        site = SiteConfig.model_validate(
            {
                "name": "dask",
                "backend": {"kind": "dask", "scheduler_address": cluster.scheduler_address},
                "cost": {"node_hours_per_simulation": 0.01},
                "max_concurrency": 4,
                "retries": 2,
                "retry_backoff": 0.0,
                "kill_grace": 0.5,
            }
        )

        async def kill_a_busy_worker() -> int:
            while True:
                running = sorted(started.iterdir())
                if running:
                    pid = int(running[0].name.split("-")[0])
                    os.kill(pid, signal.SIGKILL)
                    return pid
                await asyncio.sleep(0.05)

        store = open_store(tmp_path, "dask-lost")
        try:
            async with AllocationExecutor.from_site(site) as executor:
                killer = asyncio.ensure_future(kill_a_busy_worker())
                outcome = await launch_batch(
                    executor,
                    store,
                    campaign="dask-lost",
                    round_index=0,
                    candidates=CANDIDATES,
                    simulation=Simulation.function(simulate, id="sleepy"),
                )
                killed = await killer
            recorded = store.find_batch(outcome.key)
        finally:
            store.close()
        assert recorded is not None
        assert [r.status for r in recorded] == ["done"] * 4
        assert [r.value for r in recorded] == [sum(c) for c in CANDIDATES]
        retried = [r for r in recorded if r.retries]
        assert retried, "the killed worker's task was not retried"
        assert {retry["reason"] for r in retried for retry in r.retries} == {"KilledWorker"}
        assert all(r.attempts == 1 + len(r.retries) for r in recorded)
        # The tasks running on the killed worker were retried (Dask also fails the
        # ones it had only assigned to that worker, so there may be more).
        on_killed = {
            float(p.name.split("-")[1])
            for p in started.iterdir()
            if p.name.startswith(f"{killed}-")
        }
        assert on_killed <= {CANDIDATES[r.index][0] for r in retried}
