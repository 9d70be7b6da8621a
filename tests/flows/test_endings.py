"""How a run's ending outside the engine is recorded: a person's cancel, a failure.

A real SQLite provenance store; Prefect's own state objects (no server needed).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelled, Crashed

from flows._cli._render import shown_status
from flows._engine._fencing import RecoverySettings
from flows._prefect._endings import (
    CANCEL_REQUESTED,
    record_cancelled,
    record_failure,
    state_for_ending,
)
from flows._prefect._recovery_plan import Continuations, Continue, RecordCancel, plan
from flows._prefect._recovery_reads import read_record, seen_run
from flows._provenance import ProvenanceStore
from policies import PolicyDenied

NAME = "ending"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProvenanceStore]:
    opened = ProvenanceStore.open(tmp_path)
    opened.ensure_campaign(NAME, spec={}, site="local", seed=1, code_version="t")
    try:
        yield opened
    finally:
        opened.close()


def _status(store: ProvenanceStore) -> tuple[str, str | None]:
    (campaign,) = store.campaigns()
    return campaign["status"], campaign["error_code"]


def _run(state: object) -> FlowRun:
    return FlowRun(id=uuid4(), flow_id=uuid4(), state=state)


class TestRecordFailure:
    def test_a_campaign_still_running_is_recorded_failed_with_the_stable_code(
        self, store: ProvenanceStore
    ) -> None:
        assert record_failure(store, NAME, RuntimeError("executor did not start"))
        assert _status(store) == ("failed", "internal")
        assert [e["kind"] for e in store.events(NAME)] == ["failed"]

    def test_an_ending_the_engine_recorded_is_left_as_it_is(self, store: ProvenanceStore) -> None:
        store.set_campaign_status(NAME, "blocked", "policy_denied")
        assert not record_failure(store, NAME, PolicyDenied("round 0"))
        assert _status(store) == ("blocked", "policy_denied")


class TestRecordCancelled:
    def test_a_running_campaign_and_its_open_round_are_recorded_cancelled(
        self, store: ProvenanceStore
    ) -> None:
        store.start_round(NAME, 0)
        assert record_cancelled(store, NAME, flow_run_id="r1", actor="alice", how="test")
        assert _status(store) == ("blocked", "cancelled")
        assert store.load_checkpoint(NAME).rounds == {0: "blocked"}
        (event,) = store.events(NAME, kind="cancelled")
        assert (event["actor"], event["flow_run_id"]) == ("alice", "r1")

    def test_the_watchdog_records_who_asked_with_unattended_cancel(
        self, store: ProvenanceStore
    ) -> None:
        store.record_event(NAME, CANCEL_REQUESTED, flow_run_id="r1", actor="alice")
        assert record_cancelled(store, NAME, flow_run_id="r1", actor=None, how="prefect")
        (event,) = store.events(NAME, kind="cancelled")
        assert (event["actor"], event["details"]["how"]) == ("alice", "unattended cancel")

    def test_a_cancel_the_other_party_claimed_first_is_not_recorded_twice(
        self, store: ProvenanceStore
    ) -> None:
        """The CLI's cancel and the watchdog both saw the campaign running: one records it.

        The other party recorded the run's ending (its claim) and is about to write the
        campaign's status; this call leaves the cancel to it and returns once it is written.
        """
        store.start_round(NAME, 0)
        assert store.record_run_ending(NAME, "r1", "blocked", "cancelled")
        other = threading.Timer(0.3, store.set_campaign_status, (NAME, "blocked", "cancelled"))
        other.start()
        try:
            assert not record_cancelled(store, NAME, flow_run_id="r1", actor="bob", how="cli")
        finally:
            other.join()
        assert _status(store) == ("blocked", "cancelled")
        assert store.events(NAME, kind="cancelled") == []

    def test_a_campaign_that_ended_is_not_recorded_again(self, store: ProvenanceStore) -> None:
        store.set_campaign_status(NAME, "completed")
        assert not record_cancelled(store, NAME, flow_run_id=None, actor=None, how="test")
        assert _status(store) == ("completed", None)

    def test_inspect_shows_it_cancelled(self) -> None:
        assert shown_status("blocked", "cancelled") == "cancelled"
        assert shown_status("blocked", "policy_denied") == "blocked"


class TestCancelledByAPerson:
    """Prefect's states and the store, read as the watchdog reads them, then its plan."""

    def _plan(self, store: ProvenanceStore, flow_run: FlowRun) -> list[Any]:
        now = datetime.now(UTC)
        seen = seen_run(flow_run, None, set(), now)
        record = read_record(store, NAME, Continuations())
        return plan([seen], record, now, RecoverySettings())

    def test_the_uis_cancel_is_a_persons(self, store: ProvenanceStore) -> None:
        run = _run(Cancelled(message="Flow run was cancelled successfully."))
        assert [type(a) for a in self._plan(store, run)] == [RecordCancel]

    def test_a_runners_shutdown_is_not(self, store: ProvenanceStore) -> None:
        (action,) = self._plan(store, _run(Cancelled(message="Runner is shutting down.")))
        assert isinstance(action, Continue)
        assert not action.counted

    def test_a_fenced_out_run_is_not(self, store: ProvenanceStore) -> None:
        run = _run(Cancelled(message="fenced out: another run holds the campaign"))
        store.record_run_ending(NAME, str(run.id), "failed", "fenced_out")
        assert self._plan(store, run) == []

    def test_a_requested_cancel_counts_whatever_message_the_run_ended_with(
        self, store: ProvenanceStore
    ) -> None:
        run = _run(Cancelled(message="Runner is shutting down."))
        store.record_event(NAME, CANCEL_REQUESTED, flow_run_id=str(run.id), actor="alice")
        assert [type(a) for a in self._plan(store, run)] == [RecordCancel]

    def test_a_crash_is_not_a_cancel(self, store: ProvenanceStore) -> None:
        assert [type(a) for a in self._plan(store, _run(Crashed()))] == [Continue]

    def test_a_recorded_cancel_records_the_runs_ending(self, store: ProvenanceStore) -> None:
        run_id = str(uuid4())
        assert record_cancelled(store, NAME, flow_run_id=run_id, actor="alice", how="cli")
        assert store.run_endings(NAME)[run_id].code == "cancelled"


class TestStateForEnding:
    """What Prefect shows of a recorded ending (nothing reads its message back)."""

    def test_a_completed_campaign_is_completed(self) -> None:
        assert state_for_ending("completed", None).type.value == "COMPLETED"

    def test_a_rejection_is_a_persons_stop_not_a_failure(self) -> None:
        state = state_for_ending(
            "blocked", "approval_rejected", "round 2: approval rejected by bob"
        )
        assert state.type.value == "CANCELLED"
        assert state.message == (
            "stopped: round 2: approval rejected by bob (blocked, approval_rejected)"
        )

    def test_any_other_stop_fails_with_its_status_and_code(self) -> None:
        state = state_for_ending("escalated", "policy_denied", "rule r")
        assert state.type.value == "FAILED"
        assert state.message == "campaign escalated (policy_denied): rule r"


class TestCancelNotice:
    def test_the_campaigns_notify_people_are_told_it_was_cancelled(
        self, tmp_path: Path, webhook: Any
    ) -> None:
        demo = Path(__file__).resolve().parents[2] / "examples" / "demo"
        for item in demo.iterdir():
            if item.is_file():
                shutil.copy(item, tmp_path / item.name)
        spec = tmp_path / "campaign.toml"
        spec.write_text(
            spec.read_text() + f'\n[notify]\nwebhook_url = "{webhook.url}"\nevents = ["blocked"]\n'
        )
        home = tmp_path / "home"
        store = ProvenanceStore.open(home / "campaigns" / "demo")
        try:
            store.ensure_campaign("demo", spec={}, site="local", seed=7, code_version="t")
            params = {"spec_path": str(spec), "site": "local", "state_dir": str(home)}
            assert record_cancelled(
                store, "demo", flow_run_id="r1", actor="alice", how="test", params=params
            )
        finally:
            store.close()
        assert [p["text"] for p in webhook.posts] == [
            "[unattended] campaign demo was blocked in round 0 (cancelled)"
        ]
