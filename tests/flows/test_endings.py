"""How a run's ending outside the engine is recorded: a person's cancel, a failure.

A real SQLite provenance store; Prefect's own state objects (no server needed).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelled, Crashed

from flows._cli._render import shown_status
from flows._prefect._endings import (
    CANCEL_REQUESTED,
    cancelled_by_a_person,
    record_cancelled,
    record_failure,
)
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

    def test_a_campaign_that_ended_is_not_recorded_again(self, store: ProvenanceStore) -> None:
        store.set_campaign_status(NAME, "completed")
        assert not record_cancelled(store, NAME, flow_run_id=None, actor=None, how="test")
        assert _status(store) == ("completed", None)

    def test_inspect_shows_it_cancelled(self) -> None:
        assert shown_status("blocked", "cancelled") == "cancelled"
        assert shown_status("blocked", "policy_denied") == "blocked"


class TestCancelledByAPerson:
    def test_the_uis_cancel_is_a_persons(self, store: ProvenanceStore) -> None:
        run = _run(Cancelled(message="Flow run was cancelled successfully."))
        assert cancelled_by_a_person(run, store, NAME)

    def test_a_runners_shutdown_is_not(self, store: ProvenanceStore) -> None:
        assert not cancelled_by_a_person(
            _run(Cancelled(message="Runner is shutting down.")), store, NAME
        )

    def test_a_fenced_out_run_is_not(self, store: ProvenanceStore) -> None:
        run = _run(Cancelled(message="fenced out: another run holds the campaign"))
        assert not cancelled_by_a_person(run, store, NAME)

    def test_a_requested_cancel_counts_whatever_message_the_run_ended_with(
        self, store: ProvenanceStore
    ) -> None:
        run = _run(Cancelled(message="Runner is shutting down."))
        store.record_event(NAME, CANCEL_REQUESTED, flow_run_id=str(run.id), actor="alice")
        assert cancelled_by_a_person(run, store, NAME)

    def test_a_crash_is_not_a_cancel(self, store: ProvenanceStore) -> None:
        assert not cancelled_by_a_person(_run(Crashed()), store, NAME)


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
