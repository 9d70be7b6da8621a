"""The RADICAL-Pilot dispatch path reports to the task ledger, without a pilot.

``tasks._dispatch_pilot`` hands the pilot a command line: the where-wrapper of
``tasks._radical.pilot_command`` around ``tasks/_task_supervisor.py`` around the
program. Here that command line runs on asyncflow's local backend (a real engine,
real processes: the shell runs what a pilot's agent would), with the campaign's
real ``TaskLedger`` folder, and ``SLURM_JOB_ID``/``SLURMD_NODENAME`` set as a pilot
job's task sees them. The test-wide ones (the allocation the dispatcher watches)
are another job, so a credit to the wrong job shows.

The RADICAL-Pilot site end to end (a real pilot, a login node killed mid-batch) is
``tests/slurm/test_login_node_death.py``'s ``--long`` case.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio

from tasks import AllocationExecutor, ExecutableTask, SiteConfig
from tasks._allocations import AllocationRecord, AllocationWatch
from tasks._dispatch import Dispatcher
from tasks._task_ledger import TaskLedger, TaskRef

#: What the pilot job's task sees, and the job the watched allocation names.
TASK_JOB, TASK_NODE, OTHER_JOB = "4242", "n7", "777"
KEY = "camp/0/batch-abc/3"

#: Records its start, waits for a release file (at most 60 s), prints its stdin summed.
PROGRAM = """
import json, pathlib, sys, time
started, release = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
started.touch()
deadline = time.monotonic() + 60
while release.name != "-" and not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"sum": sum(json.load(sys.stdin))}))
"""


class ArgvEngine:
    """The real engine, running an executable's argv as a pilot's agent does: each word whole.

    asyncflow's local backend would join the words into one shell string (its
    ``shell`` default); RADICAL-Pilot quotes each argument in its launch script.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def function_task(self, fn: Callable[..., Any]) -> Any:
        return self.engine.function_task(fn)

    def executable_task(self, fn: Callable[[], Awaitable[str]]) -> Callable[[], Any]:
        task = self.engine.executable_task(fn)
        return lambda: task(task_description={"shell": False})


async def _never() -> list[str]:
    raise AssertionError("no allocation is requested here")


@pytest_asyncio.fixture
async def dispatcher(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Dispatcher]:
    """A radical_pilot dispatcher over a real asyncflow engine (local backend)."""
    site = SiteConfig.model_validate(
        {"name": "pilot-path", "backend": {"kind": "local", "dispatch": "engine"},
         "cost": {"node_hours_per_simulation": 0.1}}
    )  # fmt: skip
    async with AllocationExecutor.from_site(site) as ex:
        assert ex._parts is not None
        monkeypatch.setenv("SLURM_JOB_ID", TASK_JOB)
        monkeypatch.setenv("SLURMD_NODENAME", TASK_NODE)
        yield Dispatcher(
            pool=None,
            direct=False,
            engine=ArgvEngine(ex._parts.engine),
            remote_kind="radical_pilot",
            host="login",
            grace=0.5,
            transient_codes=frozenset(),
        )


def _task(tmp_path: Path, release: str = "-") -> ExecutableTask:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM, encoding="utf-8")
    argv = [sys.executable, str(script), str(tmp_path / "started"), release]
    return ExecutableTask(argv, stdin=json.dumps([1, 2, 3]).encode())


def _ended_elsewhere() -> AllocationRecord:
    now = time.time()
    return AllocationRecord(
        job_id=OTHER_JOB, request=1, requested_at=now, state="CANCELLED", nodes=("n9",),
        started_at=now, ended_at=now, end_reason="cancelled",
    )  # fmt: skip


def ledger_result(ledger: TaskLedger, ref: TaskRef) -> Path:
    return ledger.folder / f"{ref.digest}.result"


def wrapper_of(ledger: TaskLedger, ref: TaskRef) -> int:
    """Return the pid of the pilot wrapper that started the task's supervisor."""
    marker = ledger.started_by(ref)
    assert marker is not None
    return int(psutil.Process(int(marker["pid"])).ppid())


def _wait_gone(pid: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while pid > 0 and psutil.pid_exists(pid) and time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                time.sleep(0.2)  # exited: the loop reaps it
                continue
        time.sleep(0.05)


def _watch() -> AllocationWatch:
    return AllocationWatch(_never, env={}, poll_seconds=60.0)


def _appears(path: Path, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


class TestThePilotPathUsesTheLedger:
    @pytest.mark.asyncio
    async def test_the_task_runs_supervised_and_its_result_is_harvested(
        self, dispatcher: Dispatcher, tmp_path: Path
    ) -> None:
        ledger = TaskLedger(tmp_path / "task-results", "run-1")
        ledger.fence()
        dispatcher.ledger = ledger
        ref = ledger.ref(KEY, 2)
        outcome = await dispatcher.executable(_task(tmp_path), f"{KEY}#2", None, ref)
        assert outcome.status == "done", outcome
        assert outcome.value == {"sum": 6}  # stdin went through the wrapper and the supervisor
        assert (outcome.job_id, outcome.host) == (TASK_JOB, TASK_NODE)
        # The supervisor recorded the start and the result, for this run and attempt.
        marker = ledger.started_by(ref)
        assert marker is not None
        assert (marker["job_id"], marker["node"], marker["key"]) == (TASK_JOB, TASK_NODE, KEY)
        found = ledger.result(KEY)
        assert found is not None
        assert (found["kind"], found["exit_code"], found["token"]) == ("exec", 0, "run-1")
        # A continuation (another run) harvests it instead of running it again.
        later = TaskLedger(tmp_path / "task-results", "run-2")
        later.fence()
        again, lost = await later.settle(KEY, env={}, poll_seconds=0.1)
        assert again is not None
        assert lost == []
        harvested = dispatcher.harvested(again, _task(tmp_path), None)
        assert (harvested.status, harvested.value) == ("done", {"sum": 6})
        assert harvested.job_id == TASK_JOB

    @pytest.mark.asyncio
    async def test_a_task_of_a_dead_run_refuses_to_start_after_a_newer_run_fenced(
        self, dispatcher: Dispatcher, tmp_path: Path
    ) -> None:
        dead = TaskLedger(tmp_path / "task-results", "dead-run")
        dispatcher.ledger = dead
        TaskLedger(tmp_path / "task-results", "newer-run").fence()
        outcome = await dispatcher.executable(_task(tmp_path), f"{KEY}#1", None, dead.ref(KEY, 1))
        assert outcome.status == "failed", outcome
        assert "a newer run of the campaign took over" in outcome.stderr_tail
        assert not (tmp_path / "started").exists()  # the program never started
        # Fenced before it started: it wrote nothing (no marker the newer run would wait
        # for, no result); the newer run neither harvests it nor counts it lost: it runs it.
        assert sorted(p.name for p in (tmp_path / "task-results").iterdir()) == ["fence"]
        newer = TaskLedger(tmp_path / "task-results", "newer-run")
        assert await newer.settle(KEY, env={}, poll_seconds=0.1) == (None, [])

    @pytest.mark.asyncio
    async def test_a_dead_runs_task_started_late_leaves_the_newer_runs_record_alone(
        self, dispatcher: Dispatcher, tmp_path: Path
    ) -> None:
        # A pilot's agent holds queued tasks after its client died and may start one
        # after the continuation ran it: the continuation's marker and result stay.
        folder = tmp_path / "task-results"
        dead, newer = TaskLedger(folder, "dead-run"), TaskLedger(folder, "newer-run")
        newer.fence()
        dispatcher.ledger = newer
        ref = newer.ref(KEY, 1)
        assert (
            await dispatcher.executable(_task(tmp_path), f"{KEY}#1", None, ref)
        ).status == "done"
        (tmp_path / "started").unlink()
        dispatcher.ledger = dead
        late = await dispatcher.executable(_task(tmp_path), f"{KEY}#1", None, dead.ref(KEY, 1))
        assert late.status == "failed", late
        assert not (tmp_path / "started").exists()
        assert newer.started_by(ref) is not None
        kept = newer.result(KEY)
        assert kept is not None
        assert (kept["kind"], kept["token"]) == ("exec", "newer-run")

    @pytest.mark.asyncio
    async def test_an_interrupted_task_is_credited_to_the_job_it_started_in(
        self, dispatcher: Dispatcher, tmp_path: Path
    ) -> None:
        ledger = TaskLedger(tmp_path / "task-results", "run-1")
        ledger.fence()
        dispatcher.ledger = ledger
        dispatcher.allocations = watch = _watch()
        release = tmp_path / "release"
        ref = ledger.ref(KEY, 1)
        wrapper = 0
        running = asyncio.ensure_future(
            dispatcher.executable(_task(tmp_path, str(release)), f"{KEY}#1", None, ref)
        )
        try:
            assert await asyncio.to_thread(_appears, tmp_path / "started")
            wrapper = wrapper_of(ledger, ref)
            watch.lost.set_result(_ended_elsewhere())  # what refresh() does when the job ends
            outcome = await running
        finally:
            # A pilot's agent kills a cancelled task; the local backend lets it run: it ends
            # here, and what asyncflow left of it is collected now, not mid-way through
            # pytest's summary (a finalizer inside ast.parse is a CPython 3.11 SystemError).
            release.touch()
            assert await asyncio.to_thread(_appears, ledger_result(ledger, ref))
            await asyncio.to_thread(_wait_gone, wrapper)
            gc.collect()
        assert outcome.status == "interrupted", outcome
        assert (outcome.job_id, outcome.host) == (TASK_JOB, TASK_NODE)
        assert outcome.error_code == "allocation_ended"

    @pytest.mark.asyncio
    async def test_a_task_whose_key_is_not_durable_leaves_its_marker_only(
        self, dispatcher: Dispatcher, tmp_path: Path
    ) -> None:
        ledger = TaskLedger(tmp_path / "task-results", "run-1")
        dispatcher.ledger = ledger
        ref = ledger.ref("verifier/0", 1, durable=False)
        outcome = await dispatcher.executable(_task(tmp_path), "verifier/0#1", None, ref)
        assert (outcome.status, outcome.value, outcome.job_id) == ("done", {"sum": 6}, TASK_JOB)
        marker = ledger.started_by(ref)
        assert marker is not None
        assert marker["job_id"] == TASK_JOB
        assert not list((tmp_path / "task-results").glob("*.result"))

    @pytest.mark.asyncio
    async def test_a_task_that_never_started_is_credited_to_no_job(
        self, dispatcher: Dispatcher, tmp_path: Path
    ) -> None:
        ledger = TaskLedger(tmp_path / "task-results", "run-1")
        dispatcher.ledger = ledger
        dispatcher.allocations = watch = _watch()
        watch.lost.set_result(_ended_elsewhere())
        outcome = await dispatcher.executable(_task(tmp_path), f"{KEY}#1", None, ledger.ref(KEY, 1))
        assert outcome.status == "interrupted", outcome
        assert outcome.job_id is None
        assert "had not started" in outcome.reason
        assert not (tmp_path / "started").exists()
