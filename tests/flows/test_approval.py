"""The approval form and how an answer is judged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from flows._approval import Approval, ApprovalRequest, approval_form, describe, judge

DEADLINE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def request(**changes) -> ApprovalRequest:
    values = {
        "campaign": "demo",
        "round_index": 2,
        "call_index": 1,
        "rule": "review-round-2",
        "reason": "Round 2 needs review",
        "advice": "Approve or reject",
        "approvers": ("alice", "bob"),
        "proposed": [[0.1, 0.2], [0.3, 0.4]],
        "fallback": [[0.5, 0.5], [0.6, 0.6]],
        "node_hours": 2.0,
        "budget_remaining": 60.0,
        "disposition": "accepted",
        "deadline": DEADLINE,
    }
    return ApprovalRequest(**(values | changes))


BEFORE = DEADLINE - timedelta(minutes=5)


class TestForm:
    def test_decision_defaults_to_approve_so_an_untouched_choice_is_valid(self):
        form = approval_form(batch_size=8, description="d", allow_override=True)
        answer = form.model_validate({"approver": "alice"})
        assert answer.decision == "approve"

    def test_the_override_is_bounded_by_the_proposed_batch(self):
        form = approval_form(batch_size=8, description="d", allow_override=True)
        assert form.model_validate({"approver": "a", "batch_size": 8}).batch_size == 8
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "a", "batch_size": 9})
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "a", "batch_size": 0})

    def test_unknown_fields_and_wrong_types_are_refused(self):
        form = approval_form(batch_size=8, description="d", allow_override=True)
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "a", "approved_by_admin": True})
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "a", "decision": "maybe"})
        with pytest.raises(ValidationError):
            form.model_validate({"decision": "approve"})  # no approver

    def test_the_schema_carries_the_description_for_the_ui(self):
        form = approval_form(batch_size=8, description="## Approval needed", allow_override=True)
        assert form._description == "## Approval needed"
        schema = form.model_json_schema()
        assert schema["properties"]["decision"]["enum"] == ["approve", "reject"]
        assert "approver" in schema["required"]


class TestDescribe:
    def test_names_rule_reason_advice_cost_and_both_batches(self):
        text = describe(request())
        for expected in (
            "review-round-2",
            "Round 2 needs review",
            "Approve or reject",
            "2 node-hours",
            "alice, bob",
            "Proposed batch",
            "fallback",
            "0.1, 0.2",
            "0.5, 0.5",
        ):
            assert expected in text


class TestJudge:
    def test_an_allowed_approver_approves(self):
        verdict = judge(Approval(approver="alice", batch_size=1), request(), now=BEFORE)
        assert (verdict.verdict, verdict.approver, verdict.batch_size) == ("approved", "alice", 1)

    def test_an_allowed_approver_rejects(self):
        verdict = judge(Approval(approver="bob", decision="reject"), request(), now=BEFORE)
        assert verdict.verdict == "rejected"

    def test_anyone_else_is_not_allowed_whatever_they_chose(self):
        for decision in ("approve", "reject"):
            verdict = judge(Approval(approver="mallory", decision=decision), request(), now=BEFORE)
            assert verdict.verdict == "not_allowed"

    def test_names_are_compared_exactly_after_trimming(self):
        assert judge(Approval(approver=" alice "), request(), now=BEFORE).verdict == "approved"
        assert judge(Approval(approver="Alice"), request(), now=BEFORE).verdict == "not_allowed"

    def test_after_the_deadline_any_answer_is_a_timeout(self):
        verdict = judge(Approval(approver="alice"), request(), now=DEADLINE)
        assert verdict.verdict == "timeout"

    def test_the_system_name_before_the_deadline_is_not_allowed(self):
        verdict = judge(Approval(approver="unattended:deadline"), request(), now=BEFORE)
        assert verdict.verdict == "not_allowed"
