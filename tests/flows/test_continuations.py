"""Continuations are the campaign's: counted in its provenance, capped, with a doubling pause."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.states import Completed, Crashed, Running

from flows._engine._fencing import RecoverySettings
from flows._prefect import _recovery as recovery
from flows._prefect import _recovery_reads as reads
from flows._prefect._recovery import stop_exhausted
from flows._prefect._recovery_note import recovery_note
from flows._prefect._recovery_plan import EXHAUSTED_CODE, MAX_CONTINUATIONS, StopExhausted
from flows._prefect._recovery_reads import continuations
from flows._provenance import ProvenanceStore
from tasks import TaskResult

SETTINGS = RecoverySettings(lease_ttl_seconds=60, heartbeat_seconds=10, watchdog_seconds=2)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProvenanceStore]:
    opened = ProvenanceStore.open(tmp_path / "c")
    opened.ensure_campaign("c", spec={}, site="local", seed=1, code_version="t")
    try:
        yield opened
    finally:
        opened.close()


def _continued(store: ProvenanceStore, *, counted: bool = True) -> None:
    progress = store.progress("c")
    store.record_event(
        "c",
        "continued",
        flow_run_id=str(uuid4()),
        details={
            "after": str(uuid4()),
            "why": "its run crashed",
            "counted": counted,
            "progress": [progress.rounds, progress.tasks] if counted else None,
        },
    )


def _finish_a_task(store: ProvenanceStore) -> None:
    store.start_round("c", 0)
    store.record_batch_launched(
        "c/0/k", campaign="c", round_index=0, candidates=[[0.5]], backend="local"
    )
    result = TaskResult(
        index=0, key="t", status="done", value={"value": 1.0}, runtime=1.0, host="h", attempts=1
    )
    store.record_batch_results("c/0/k", [result])


def _run(state: Any) -> FlowRun:
    return FlowRun(id=uuid4(), name="r", flow_id=uuid4(), state=state)


class TestContinuations:
    def test_counted_continuations_at_the_same_progress_are_counted(
        self, store: ProvenanceStore
    ) -> None:
        for _ in range(3):
            _continued(store)
        _continued(store, counted=False)  # after a runner's shutdown: not counted
        tally = continuations(store, "c")
        assert tally.count == 3
        assert not tally.exhausted

    def test_progress_starts_a_new_count(self, store: ProvenanceStore) -> None:
        for _ in range(MAX_CONTINUATIONS):
            _continued(store)
        assert continuations(store, "c").exhausted
        _finish_a_task(store)
        assert continuations(store, "c").count == 0

    def test_the_pause_doubles_from_the_last_continuation(self, store: ProvenanceStore) -> None:
        assert continuations(store, "c").not_before(SETTINGS) is None
        _continued(store)
        first = continuations(store, "c")
        assert first.last_at is not None
        assert first.not_before(SETTINGS) == first.last_at + timedelta(seconds=2)
        _continued(store)
        _continued(store)
        third = continuations(store, "c")
        assert third.last_at is not None
        assert third.not_before(SETTINGS) == third.last_at + timedelta(seconds=8)

    def test_the_count_is_the_campaign_s_whatever_store_connection_reads_it(
        self, store: ProvenanceStore, tmp_path: Path
    ) -> None:
        """A new runner (a new process, a new connection) sees the same count."""
        for _ in range(2):
            _continued(store)
        other = ProvenanceStore.open(tmp_path / "c")
        try:
            assert continuations(other, "c").count == 2
        finally:
            other.close()


class TestStopExhausted:
    def test_the_campaign_is_recorded_failed_with_its_code_and_a_new_count_starts(
        self, store: ProvenanceStore, tmp_path: Path
    ) -> None:
        for _ in range(MAX_CONTINUATIONS):
            _continued(store)
        tally = continuations(store, "c")
        params = {"spec_path": str(tmp_path / "missing.toml")}  # no notice config to load
        action = StopExhausted(str(uuid4()), "its run crashed", datetime.now(UTC), tally.count)
        said = stop_exhausted(store, params, "c", action, tally)
        assert EXHAUSTED_CODE in said
        (row,) = store.campaigns()
        assert (row["status"], row["error_code"]) == ("failed", EXHAUSTED_CODE)
        (event,) = store.events("c", EXHAUSTED_CODE)
        assert event["details"]["continuations"] == MAX_CONTINUATIONS
        # A person who submits it again starts a new count.
        assert continuations(store, "c").count == 0


class TestStatusNote:
    def test_a_stopped_campaign_is_not_promised_a_continuation(
        self, store: ProvenanceStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.set_campaign_status("c", "failed", EXHAUSTED_CODE)
        monkeypatch.setattr(reads, "campaign_store", lambda _run: ("c", _Unclosed(store)))
        note = recovery_note(_run(Crashed()), runner_alive=True)
        assert note is not None
        assert note.startswith(f"stopped ({EXHAUSTED_CODE})")
        assert "continues it within" not in note

    def test_a_crashed_campaign_in_its_pause_says_when_and_which_continuation(
        self, store: ProvenanceStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for _ in range(3):
            _continued(store)
        monkeypatch.setattr(reads, "campaign_store", lambda _run: ("c", _Unclosed(store)))
        note = recovery_note(_run(Crashed()), runner_alive=True)
        assert note is not None
        assert f"(continuation 4 of {MAX_CONTINUATIONS})" in note
        within = int(note.split("within ")[1].split(" s")[0])
        assert 2 <= within <= 8  # 2 s x 2**2 after the last continuation, just recorded

    def test_at_the_cap_the_note_says_it_will_be_stopped(
        self, store: ProvenanceStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for _ in range(MAX_CONTINUATIONS):
            _continued(store)
        monkeypatch.setattr(reads, "campaign_store", lambda _run: ("c", _Unclosed(store)))
        note = recovery_note(_run(Crashed()), runner_alive=True)
        assert note is not None
        assert "the runner stops it (continuations_exhausted)" in note


class _Unclosed:
    """The test's store, which ``recovery_note`` may close without closing it."""

    def __init__(self, store: ProvenanceStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def close(self) -> None:
        pass


class TestUnrecorded:
    def test_continuations_a_full_disk_kept_from_the_record_still_count(
        self, store: ProvenanceStore
    ) -> None:
        """A runner that could not write its ``continued`` events still stops at the cap."""
        _continued(store)
        watchdog = recovery.Watchdog(SETTINGS)
        recorded = continuations(store, "c")
        watchdog.unrecorded["c"] = replace(recorded, count=MAX_CONTINUATIONS)
        assert watchdog._counted_so_far(store, "c").exhausted

    def test_progress_made_since_forgets_them(self, store: ProvenanceStore) -> None:
        watchdog = recovery.Watchdog(SETTINGS)
        watchdog.unrecorded["c"] = replace(continuations(store, "c"), count=MAX_CONTINUATIONS)
        _finish_a_task(store)
        assert watchdog._counted_so_far(store, "c").count == 0


class _Client:
    """The Prefect client calls ``_sweep_one`` makes: the runs it reads, the states it sets."""

    def __init__(self, runs: list[FlowRun]) -> None:
        self.runs = runs
        self.states: list[tuple[Any, Any]] = []

    async def read_flow_runs(self, **_: Any) -> list[FlowRun]:
        return self.runs

    async def set_flow_run_state(self, flow_run_id: Any, state: Any, **_: Any) -> None:
        self.states.append((flow_run_id, state))


def _lease_taken_by_a_process_that_exits(database: Path, owner: str) -> int:
    """Have another process take the campaign's lease for ``owner`` and exit; return its pid."""
    script = (
        "import os, sys; from flows._provenance import ProvenanceStore; "
        "s = ProvenanceStore.open(sys.argv[1]); "
        "assert s.acquire_lease('c', sys.argv[2], ttl=60); print(os.getpid())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(database), owner],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(done.stdout.strip())


class TestSweepOfARunningCampaign:
    """A campaign whose run a process of this runner executes costs the sweep no store."""

    def _sweep(self, runs: list[FlowRun], alive: set[str]) -> list[str]:
        return self._sweep_with(_Client(runs), alive)

    def _sweep_with(self, client: _Client, alive: set[str]) -> list[str]:
        registration = SimpleNamespace(parameters={"spec_path": "x"}, deployment_id="d")
        watchdog = recovery.Watchdog(SETTINGS)
        sweep = watchdog._sweep_one(
            client, SimpleNamespace(id=uuid4()), registration, datetime.now(UTC), alive
        )
        return asyncio.run(sweep)

    def test_a_run_alive_here_leaves_the_spec_and_provenance_closed(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def no_store(_parameters: Any) -> Any:
            raise AssertionError("the store was opened")

        monkeypatch.setattr(reads, "campaign_store", no_store)
        running = _run(Running())
        assert self._sweep([running, _run(Completed())], {str(running.id)}) == []

    # A Running state made in the test (one made at collection would be minutes old by
    # the time a busy run reaches it, and an old Running state without a lease is an
    # orphan whatever the lease says). Young, and not alive here: only its lease can
    # make it an orphan, so what the sweep does shows it read the lease.
    def test_a_run_elsewhere_whose_lease_holder_died_is_crashed_naming_its_pid(
        self, store: ProvenanceStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        running = _run(Running())
        pid = _lease_taken_by_a_process_that_exits(tmp_path / "c", str(running.id))
        monkeypatch.setattr(reads, "campaign_store", lambda _p: ("c", _Unclosed(store)))
        client = _Client([running])

        done = self._sweep_with(client, set())

        assert done == [f"crashed {running.id}: its process (pid {pid}) is gone"]
        assert [(str(i), s.type.value) for i, s in client.states] == [(str(running.id), "CRASHED")]
        (event,) = store.events("c", "orphan_crashed")
        assert event["flow_run_id"] == str(running.id)

    def test_a_run_elsewhere_holding_a_live_lease_is_left_alone(
        self, store: ProvenanceStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        running = _run(Running())
        assert store.acquire_lease("c", str(running.id), ttl=60)  # this live process holds it
        monkeypatch.setattr(reads, "campaign_store", lambda _p: ("c", _Unclosed(store)))
        client = _Client([running])

        assert self._sweep_with(client, set()) == []
        assert client.states == []
        assert store.events("c", "orphan_crashed") == []

    def test_a_finished_campaign_is_read_once_until_its_runs_change(
        self, store: ProvenanceStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        opened: list[Any] = []

        def campaign_store(parameters: Any) -> Any:
            opened.append(parameters)
            return "c", _Unclosed(store)

        monkeypatch.setattr(reads, "campaign_store", campaign_store)
        store.set_campaign_status("c", "completed")
        done = FlowRun(
            id=uuid4(), name="r", flow_id=uuid4(), state=Completed(), parameters={"spec_path": "x"}
        )
        store.record_run_ending("c", str(done.id), "completed")
        registration = SimpleNamespace(parameters={"spec_path": "x"}, deployment_id="d")
        watchdog = recovery.Watchdog(SETTINGS)
        deployment = SimpleNamespace(id=uuid4())
        for _ in range(3):
            sweep = watchdog._sweep_one(
                _Client([done]), deployment, registration, datetime.now(UTC), set()
            )
            assert asyncio.run(sweep) == []
        assert len(opened) == 1
