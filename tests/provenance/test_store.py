"""The store's writes round-trip on SQLite and PostgreSQL, once each, in one piece."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select

from acceptance import Attempt, Verdict
from flows._provenance import (
    ApprovalRow,
    CandidateFateRecord,
    Checkpoint,
    GateCallEnd,
    TaskResultRecord,
)
from flows._provenance._schema import AttemptRow, PolicyDecision, TaskResultRow, table
from policies import InternalError, NotFound, SpecInvalid, ValidationFailed


def _count(store: Any, model: Any) -> int:
    with store.engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(table(model))).scalar())


def _result(index: int, **overrides: Any) -> dict[str, Any]:
    base = {
        "index": index,
        "key": f"t{index}",
        "status": "done",
        "value": float(index),
        "runtime": 1.0,
        "host": "h",
        "exit_code": 0,
        "stderr_tail": "",
        "attempts": 1,
        "error_code": None,
        "retries": [],
    }
    return {**base, **overrides}


class TestCampaign:
    def test_ensure_campaign_returns_the_same_id_twice(self, store: Any) -> None:
        first = store.ensure_campaign("c", spec={"a": 1}, site="local", seed=1, code_version="v")
        again = store.ensure_campaign("c", spec={"a": 1}, site="local", seed=1, code_version="v")
        assert first == again

    def test_a_different_spec_under_the_same_name_is_refused(self, store: Any) -> None:
        store.ensure_campaign("c", spec={"a": 1}, site="local", seed=1, code_version="v")
        with pytest.raises(SpecInvalid, match="'c'"):
            store.ensure_campaign("c", spec={"a": 2}, site="local", seed=1, code_version="v")

    def test_status_and_error_code_are_recorded(self, store: Any) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        store.set_campaign_status("c", "blocked", "policy_denied")
        assert store.summary("c")["campaign"]["status"] == "blocked"
        assert store.summary("c")["campaign"]["error_code"] == "policy_denied"

    def test_an_unknown_status_is_refused(self, store: Any) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        with pytest.raises(ValidationFailed, match="status"):
            store.set_campaign_status("c", "paused")

    def test_writing_to_an_unknown_campaign_raises_not_found(self, store: Any) -> None:
        with pytest.raises(NotFound, match="'ghost'"):
            store.start_round("ghost", 0)


class TestCheckpoint:
    def test_an_unknown_campaign_has_an_empty_checkpoint(self, store: Any) -> None:
        assert store.load_checkpoint("new") == Checkpoint(None, (), None, None, {})

    def test_the_last_completed_round_and_its_states_come_back(
        self, store: Any, record_campaign: Any
    ) -> None:
        record_campaign(store, "demo", rounds=2)
        store.start_round("demo", 2)
        # The running round's decision is decided again when the campaign resumes it.
        store.record_decision("demo", 2, 0, {"outcome": "retry", "reason": "r", "code": None})
        checkpoint = store.load_checkpoint("demo")
        assert checkpoint == Checkpoint(
            last_completed_round=1,
            surrogate_states=({"n": 1}, {"n": 2}),
            policy_state={"spent": 1},
            planner_state=None,
            rounds={0: "completed", 1: "completed", 2: "running"},
            decisions=("continue", "suspend"),
        )

    def test_every_completed_round_gives_back_its_surrogate_state_in_order(
        self, store: Any, record_campaign: Any
    ) -> None:
        # Each round saves what it added to the surrogate (a whole state on every round
        # grew the record with the square of the rounds); a resumed campaign reads
        # them all back. A round that saved none, or did not complete, is left out.
        record_campaign(store, "demo", rounds=3)
        store.start_round("demo", 3)
        store.checkpoint_round(
            "demo", 4, surrogate_state=None, policy_state={}, planner_state={}, status="completed"
        )
        store.start_round("demo", 5)
        assert store.load_checkpoint("demo").surrogate_states == ({"n": 1}, {"n": 2}, {"n": 3})

    def test_a_round_stopped_before_anything_of_it_was_recorded_is_recorded_stopped(
        self, store: Any
    ) -> None:
        # Its fallback failed, say: the round's first record would have been its gate call.
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        store.set_campaign_status("c", "failed", "fallback_unavailable", round_index=4)
        [round_row] = store.summary("c")["rounds"]
        assert (round_row["index"], round_row["status"]) == (4, "failed")
        assert round_row["finished_at"] is not None

    def test_a_round_whose_first_record_was_rolled_back_is_recorded_by_the_next(
        self, store: Any
    ) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")

        def fails_after_the_round(connection: Any) -> None:
            store._ensure_round(connection, store._id(connection, "c"), 2)
            raise ValidationFailed("refused after the round's insert")

        with pytest.raises(ValidationFailed):
            store._write(fails_after_the_round)
        assert store.summary("c")["rounds"] == []
        store.record_decision("c", 2, 1, {"outcome": "continue"})
        assert [r["index"] for r in store.summary("c")["rounds"]] == [2]

    def test_start_round_leaves_a_checkpointed_round_alone(self, store: Any) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        store.checkpoint_round(
            "c", 0, surrogate_state=[1], policy_state={}, planner_state={}, status="completed"
        )
        store.start_round("c", 0)
        assert store.load_checkpoint("c").rounds == {0: "completed"}


class TestGate:
    def _call(self, store: Any) -> int:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        return int(
            store.record_gate_call(
                "c",
                3,
                0,
                gate="planner",
                budget=2,
                fallback_hash="abc",
                fallback_value={"x": [1.0]},
            )
        )

    def test_a_gate_call_is_recorded_with_its_fallback_before_attempts(self, store: Any) -> None:
        call = self._call(store)
        [row] = store.gate_calls("c", 3)
        assert (row["id"], row["disposition"], row["fallback_hash"], row["fallback_value"]) == (
            call,
            "pending",
            "abc",
            {"x": [1.0]},
        )

    def test_recording_the_gate_call_again_returns_its_id(self, store: Any) -> None:
        call = self._call(store)
        assert (
            store.record_gate_call(
                "c",
                3,
                0,
                gate="planner",
                budget=2,
                fallback_hash="abc",
                fallback_value={"x": [1.0]},
            )
            == call
        )

    def test_a_different_fallback_hash_on_replay_is_an_internal_error(self, store: Any) -> None:
        self._call(store)
        with pytest.raises(InternalError, match="not deterministic"):
            store.record_gate_call(
                "c", 3, 0, gate="planner", budget=2, fallback_hash="xyz", fallback_value=None
            )

    def test_an_attempt_round_trips_with_verdicts_scores_and_trace(self, store: Any) -> None:
        call = self._call(store)
        attempt = Attempt(
            number=1,
            value={"x": [2.0]},
            rejected_by="bounds",
            reason="x above 1",
            scores={"novelty": 0.25},
            duration=0.5,
            trace_id="a" * 32,
            span_id="b" * 16,
            verdicts=(
                Verdict("schema", True, None, 0.1),
                Verdict("bounds", False, "x above 1", 0.2),
            ),
        )
        store.record_attempt(call, attempt)
        assert store.attempts(call) == [
            {
                "number": 1,
                "value": {"x": [2.0]},
                "rejected_by": "bounds",
                "reason": "x above 1",
                "verdicts": [
                    {"check": "schema", "passed": True, "reason": None, "duration": 0.1},
                    {"check": "bounds", "passed": False, "reason": "x above 1", "duration": 0.2},
                ],
                "scores": {"novelty": 0.25},
                "duration": 0.5,
                "trace_id": "a" * 32,
                "span_id": "b" * 16,
                "failed_by": None,
            }
        ]

    def test_a_verdicts_details_are_kept_with_it(self, store: Any) -> None:
        call = self._call(store)
        where = {"tasks": [{"index": 0, "job_id": "41", "host": "n1"}], "job_ids": ["41"]}
        attempt = Attempt(
            number=1,
            value=1,
            duration=0.1,
            verdicts=(Verdict("verifier", True, None, 0.3, where),),
        )
        store.record_attempt(call, attempt)
        (verdict,) = store.attempts(call)[0]["verdicts"]
        assert verdict["details"] == where

    def test_recording_an_attempt_twice_leaves_one_row(self, store: Any) -> None:
        call = self._call(store)
        attempt = Attempt(number=1, value=1, duration=0.1)
        store.record_attempt(call, attempt)
        store.record_attempt(call, attempt.model_dump())
        assert _count(store, AttemptRow) == 1

    def test_bulk_attempts_are_recorded_in_order(self, store: Any) -> None:
        call = self._call(store)
        store.record_attempts(call, [Attempt(number=n, value=n, duration=0.0) for n in (2, 1, 3)])
        assert [a["number"] for a in store.attempts(call)] == [1, 2, 3]

    def test_non_finite_numbers_are_stored_as_strings(self, store: Any) -> None:
        call = self._call(store)
        store.record_attempt(
            call, {"number": 1, "value": [float("inf"), float("nan")], "duration": 0.0}
        )
        assert store.attempts(call)[0]["value"] == ["Infinity", "NaN"]

    def test_an_attempt_for_an_unknown_gate_call_raises_not_found(self, store: Any) -> None:
        with pytest.raises(NotFound, match="gate call"):
            store.record_attempt(999, Attempt(number=1, duration=0.0))

    def test_finishing_records_disposition_and_attempts_used(self, store: Any) -> None:
        call = self._call(store)
        store.finish_gate_call(call, "fallback", 2)
        [row] = store.gate_calls("c", 3)
        assert (row["disposition"], row["attempts_used"]) == ("fallback", 2)

    def test_finishing_with_attempts_records_them_with_the_end(self, store: Any) -> None:
        call = self._call(store)
        crashed = Attempt(number=1, value=1, failed_by="verifier", reason="died", duration=0.0)
        store.record_attempt(call, crashed)
        again = Attempt(number=1, value=1, rejected_by="bounds", reason="out", duration=0.0)
        store.finish_gate_call(
            call, "accepted", 2, attempts=[again, Attempt(number=2, value=2, duration=0.0)]
        )
        [row] = store.gate_calls("c", 3)
        assert (row["disposition"], row["attempts_used"]) == ("accepted", 2)
        # The checked-again attempt replaces the failed one; the second is new.
        assert [(a["number"], a["failed_by"], a["rejected_by"]) for a in store.attempts(call)] == [
            (1, None, "bounds"),
            (2, None, None),
        ]

    def test_finishing_an_unknown_gate_call_records_none_of_its_attempts(self, store: Any) -> None:
        with pytest.raises(NotFound, match="gate call"):
            store.finish_gate_call(999, "accepted", 1, attempts=[Attempt(number=1, duration=0.0)])
        assert _count(store, AttemptRow) == 0

    def test_the_round_starts_when_its_caller_began_it(self, store: Any) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        began = datetime(2026, 12, 5, 8, 0, 0, 250000, tzinfo=UTC)
        store.record_gate_call(
            "c",
            0,
            1,
            gate="planner",
            budget=2,
            fallback_hash="abc",
            fallback_value=None,
            round_started_at=began,
        )
        [round_row] = store.summary("c")["rounds"]
        assert datetime.fromisoformat(round_row["started_at"]) == began

    def test_a_decision_lands_with_the_call_it_decided_on_and_its_fates(self, store: Any) -> None:
        call = self._call(store)
        store.record_attempt(call, Attempt(number=1, value=1, rejected_by="b", duration=0.0))
        last = Attempt(number=2, value=2, duration=0.0)
        fates = [
            CandidateFateRecord("proposal", 0, [0.1], "refused", rule="r"),
            CandidateFateRecord("proposal", 1, [0.2], "launched"),
        ]
        store.record_decision(
            "c",
            3,
            1,
            {"outcome": "continue"},
            gate_call=GateCallEnd(call, "accepted", 2, (last,)),
            call_index=0,
            fates=fates,
        )
        [row] = store.gate_calls("c", 3)
        assert (row["disposition"], row["attempts_used"]) == ("accepted", 2)
        assert [a["number"] for a in store.attempts(call)] == [1, 2]
        assert [d["outcome"] for d in store.decisions("c", 3)] == ["continue"]
        view = store.round_view("c", 3)["candidates"]
        assert [(f["call_index"], f["candidate_index"], f["fate"]) for f in view] == [
            (0, 0, "refused"),
            (0, 1, "launched"),
        ]

    def test_a_decision_on_an_unknown_call_records_nothing(self, store: Any) -> None:
        self._call(store)
        launched = CandidateFateRecord("proposal", 0, [0.1], "launched")
        with pytest.raises(NotFound, match="gate call"):
            store.record_decision(
                "c",
                3,
                1,
                {"outcome": "continue"},
                gate_call=GateCallEnd(999, "accepted", 1, (Attempt(number=1, duration=0.0),)),
                call_index=0,
                fates=[launched],
            )
        assert store.decisions("c", 3) == []
        assert store.round_view("c", 3)["candidates"] == []
        assert _count(store, AttemptRow) == 0

    def test_fates_without_their_gate_call_are_refused_naming_the_field(self, store: Any) -> None:
        self._call(store)
        launched = CandidateFateRecord("proposal", 0, [0.1], "launched")
        with pytest.raises(ValidationFailed) as caught:
            store.record_decision("c", 3, 1, {"outcome": "continue"}, fates=[launched])
        assert caught.value.details == {"field": "call_index"}
        assert store.decisions("c", 3) == []

    def test_a_second_gate_call_in_a_round_gets_its_own_row(self, store: Any) -> None:
        first = self._call(store)
        second = store.record_gate_call(
            "c", 3, 1, gate="planner", budget=2, fallback_hash="abc", fallback_value=None
        )
        assert first != second
        assert [c["call_index"] for c in store.gate_calls("c", 3)] == [0, 1]


class TestDecisions:
    def test_a_decision_record_round_trips_with_unknown_keys_in_extra(self, store: Any) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        record = {
            "outcome": "block",
            "reason": "over budget",
            "code": "budget_exceeded",
            "rules_fired": ["budget"],
            "severities": {"budget": "HARD_STOP"},
            "explanation": "node hours 70 > 64",
            "shadow": [],
            "state_after": {"n": 1},
            "round": 2,
        }
        store.record_decision("c", 2, 0, record)
        store.record_decision("c", 2, 0, record)
        [row] = store.decisions("c", 2)
        assert {k: row[k] for k in record if k != "round"} == {
            k: v for k, v in record.items() if k != "round"
        }
        assert row["extra"] == {"round": 2}
        assert _count(store, PolicyDecision) == 1


class TestApprovals:
    def _request(self, store: Any) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        store.record_approval_request(
            "c",
            4,
            key="k4",
            rule="big",
            approvers=["bob", "alice"],
            description="64 node hours",
            flow_run_id="run-9",
        )

    def test_a_pending_request_round_trips(self, store: Any) -> None:
        self._request(store)
        found = store.find_approval("k4")
        assert isinstance(found, ApprovalRow)
        assert (
            found.campaign,
            found.round_index,
            found.rule,
            found.approvers_allowed,
            found.flow_run_id,
            found.decision,
            found.events,
        ) == ("c", 4, "big", ["alice", "bob"], "run-9", None, ())

    def test_a_request_keeps_the_rules_it_was_made_under(self, store: Any) -> None:
        """Approvers, proof and override permission are the request's, recorded once."""
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        for approvers, proof in ((["alice", "bob"], True), (["alice", "bob", "eve"], False)):
            store.record_approval_request(  # the second (a later, changed submission) is a no-op
                "c",
                2,
                key="k2",
                rule="r",
                approvers=approvers,
                description=None,
                flow_run_id=None,
                require_proof=proof,
                allow_override=False,
            )
        found = store.find_approval("k2")
        assert (found.approvers_allowed, found.require_proof, found.allow_override) == (
            ["alice", "bob"],
            True,
            False,
        )

    def test_a_refusal_says_why(self, store: Any) -> None:
        self._request(store)
        store.record_approval_event(
            "k4",
            decided_by="alice",
            decision="approved",
            allowed=False,
            refusal="override_ambiguous",
        )
        found = store.find_approval("k4")
        assert [(e.allowed, e.refusal) for e in found.events] == [(False, "override_ambiguous")]
        assert found.decision is None

    def test_a_refused_approver_is_recorded_without_settling(self, store: Any) -> None:
        self._request(store)
        settled = store.record_approval_event(
            "k4", decided_by="eve", decision="approved", allowed=False
        )
        found = store.find_approval("k4")
        assert (settled, found.decision, [e.decided_by for e in found.events]) == (
            False,
            None,
            ["eve"],
        )

    def test_the_first_allowed_decision_settles_and_later_ones_are_kept(self, store: Any) -> None:
        self._request(store)
        store.record_approval_event(
            "k4",
            decided_by="alice",
            decision="rejected",
            comment="too big",
            overrides={"n": 4},
            allowed=True,
        )
        store.record_approval_event("k4", decided_by="bob", decision="approved", allowed=True)
        found = store.find_approval("k4")
        assert (found.decision, found.decided_by, found.comment, found.overrides) == (
            "rejected",
            "alice",
            "too big",
            {"n": 4},
        )
        assert [(e.decided_by, e.settled) for e in found.events] == [
            ("alice", True),
            ("bob", False),
        ]

    def test_an_event_key_makes_a_replayed_event_count_once(self, store: Any) -> None:
        self._request(store)
        for _ in range(2):
            store.record_approval_event(
                "k4", decided_by="alice", decision="approved", allowed=True, event_key="input-1"
            )
        assert len(store.find_approval("k4").events) == 1

    def test_an_unknown_key_has_no_approval(self, store: Any) -> None:
        assert store.find_approval("nope") is None

    def test_an_event_for_an_unknown_key_raises_not_found(self, store: Any) -> None:
        with pytest.raises(NotFound, match="'nope'"):
            store.record_approval_event("nope", decided_by="a", decision="approved", allowed=True)


class _Result:
    """A TaskResult-like object with attributes, as the tasks package builds them."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class TestBatches:
    def _launch(self, store: Any) -> None:
        store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="v")
        store.record_batch_launched(
            "b1", campaign="c", round_index=0, candidates=[[0.1], [0.2]], backend="local"
        )

    def test_a_launched_batch_has_no_results_yet(self, store: Any) -> None:
        self._launch(store)
        assert store.find_batch("b1") is None

    def test_an_unknown_batch_has_no_results(self, store: Any) -> None:
        assert store.find_batch("nope") is None

    def test_results_from_objects_round_trip_as_records(self, store: Any) -> None:
        self._launch(store)
        store.record_batch_results(
            "b1",
            [
                _Result(
                    **_result(
                        1,
                        status="timeout",
                        value=None,
                        exit_code=None,
                        error_code="deadline_exceeded",
                        retries=[{"n": 1}],
                    )
                ),
                _Result(**_result(0, value={"objective": 0.5, "aux": [1]})),
            ],
        )
        assert store.find_batch("b1") == [
            TaskResultRecord(
                0,
                "t0",
                "done",
                {"objective": 0.5, "aux": [1]},
                1.0,
                "h",
                0,
                "",
                1,
                None,
                [],
                candidate=[0.1],
            ),
            TaskResultRecord(
                1,
                "t1",
                "timeout",
                None,
                1.0,
                "h",
                None,
                "",
                1,
                "deadline_exceeded",
                [{"n": 1}],
                candidate=[0.2],
            ),
        ]

    def test_recording_results_twice_leaves_one_row_per_index(self, store: Any) -> None:
        self._launch(store)
        store.record_batch_launched(
            "b1", campaign="c", round_index=0, candidates=[[9]], backend="other"
        )
        store.record_batch_results("b1", [_result(0)])
        store.record_batch_results("b1", [_result(0, value=99.0), _result(1)])
        assert _count(store, TaskResultRow) == 2
        assert store.find_batch("b1")[0].value == 0.0

    def test_results_for_an_unknown_batch_raise_not_found(self, store: Any) -> None:
        with pytest.raises(NotFound, match="'nope'"):
            store.record_batch_results("nope", [_result(0)])

    def test_an_invalid_task_status_writes_nothing(self, store: Any) -> None:
        self._launch(store)
        with pytest.raises(ValidationFailed, match="status"):
            store.record_batch_results("b1", [_result(0), _result(1, status="weird")])
        assert (store.find_batch("b1"), _count(store, TaskResultRow)) == (None, 0)


class TestReaders:
    def test_the_summary_counts_rounds_dispositions_and_the_best_result(
        self, store: Any, record_campaign: Any
    ) -> None:
        record_campaign(store, "demo", rounds=2)
        summary = store.summary("demo")
        assert summary["totals"] == {
            "rounds": 2,
            "gate_calls": 2,
            "attempts": 4,
            "dispositions": {"accepted": 2},
            "acceptance_rate": 1.0,
            "attempt_acceptance_rate": 0.5,
            "fallbacks": 0,
        }
        assert (summary["best_result"]["objective"], summary["best_result"]["round_index"]) == (
            0.5,
            1,
        )
        assert [a["decided_by"] for a in summary["approvals"]] == ["alice"]

    def test_the_round_view_answers_the_scientists_questions(
        self, store: Any, record_campaign: Any
    ) -> None:
        record_campaign(store, "demo", rounds=2)
        view = store.round_view("demo", 1)
        rejected = view["gate_calls"][0]["attempts"][0]
        assert (rejected["value"], rejected["rejected_by"], rejected["reason"]) == (
            {"x": [9.0]},
            "bounds",
            "x[0] above 1.0",
        )
        assert view["decisions"][0]["outcome"] == "suspend"
        assert view["approvals"][0]["decided_by"] == "alice"
        assert [r["status"] for r in view["batches"][0]["results"]] == ["done", "failed"]

    def test_an_unknown_round_raises_not_found(self, store: Any, record_campaign: Any) -> None:
        record_campaign(store, "demo", rounds=1)
        with pytest.raises(NotFound, match="no round 5"):
            store.round_view("demo", 5)
