"""The approval form and how an answer is judged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from flows._engine._approval import ApprovalRequest, describe, judge
from flows._prefect._approval_form import Approval, approval_form

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
    def test_the_decision_must_be_chosen(self):
        form = approval_form(batch_size=8, description="d", allow_override=True)
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "alice"})
        assert "decision" in form.model_json_schema()["required"]
        answer = form.model_validate({"approver": "alice", "decision": "approve"})
        assert answer.decision == "approve"

    def test_the_override_is_bounded_by_the_proposed_batch(self):
        form = approval_form(batch_size=8, description="d", allow_override=True)
        assert (
            form.model_validate(
                {"approver": "a", "decision": "approve", "batch_size": 8}
            ).batch_size
            == 8
        )
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "a", "decision": "approve", "batch_size": 9})
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "a", "decision": "approve", "batch_size": 0})

    def test_unknown_fields_and_wrong_types_are_refused(self):
        form = approval_form(batch_size=8, description="d", allow_override=True)
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "a", "decision": "approve", "approved_by_admin": True})
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
        verdict = judge(
            Approval(approver="alice", decision="approve", batch_size=1), request(), now=BEFORE
        )
        assert (verdict.verdict, verdict.approver, verdict.batch_size) == ("approved", "alice", 1)

    def test_an_allowed_approver_rejects(self):
        verdict = judge(Approval(approver="bob", decision="reject"), request(), now=BEFORE)
        assert verdict.verdict == "rejected"

    def test_anyone_else_is_not_allowed_whatever_they_chose(self):
        for decision in ("approve", "reject"):
            verdict = judge(Approval(approver="mallory", decision=decision), request(), now=BEFORE)
            assert verdict.verdict == "not_allowed"

    def test_names_are_compared_exactly_after_trimming(self):
        assert (
            judge(Approval(approver=" alice ", decision="approve"), request(), now=BEFORE).verdict
            == "approved"
        )
        assert (
            judge(Approval(approver="Alice", decision="approve"), request(), now=BEFORE).verdict
            == "not_allowed"
        )

    def test_after_the_deadline_any_answer_is_a_timeout(self):
        verdict = judge(Approval(approver="alice", decision="approve"), request(), now=DEADLINE)
        assert verdict.verdict == "timeout"

    def test_the_system_name_before_the_deadline_is_not_allowed(self):
        verdict = judge(
            Approval(approver="unattended:deadline", decision="approve"), request(), now=BEFORE
        )
        assert verdict.verdict == "not_allowed"


class TestASubsetOfCandidates:
    def test_the_form_bounds_each_index_by_the_proposed_batch_and_names_the_field(self):
        form = approval_form(batch_size=8, description="d", allow_override=True)
        answer = form.model_validate({"approver": "a", "decision": "approve", "candidates": [5, 0]})
        assert answer.candidates == [5, 0]
        for bad in ([8], [-1], [2, 2]):
            with pytest.raises(ValidationError) as caught:
                form.model_validate({"approver": "a", "decision": "approve", "candidates": bad})
            assert caught.value.errors()[0]["loc"][0] == "candidates"
        # Untouched (or emptied) runs the whole batch: the judge sees no subset.
        untouched = form.model_validate({"approver": "a", "decision": "approve"})
        assert untouched.candidates == []
        # What the server checks an answer against, and what the UI renders: a select
        # of exactly the batch's numbers (an enum), no "list | None" type picker.
        schema = form.model_json_schema()["properties"]["candidates"]
        assert "anyOf" not in schema
        assert (schema["items"]["enum"], schema["uniqueItems"]) == (list(range(8)), True)

    def test_with_overrides_off_the_form_takes_no_subset(self):
        form = approval_form(batch_size=8, description="d", allow_override=False)
        with pytest.raises(ValidationError) as caught:
            form.model_validate({"approver": "a", "decision": "approve", "candidates": [0]})
        assert caught.value.errors()[0]["loc"][0] == "candidates"

    def test_the_judge_carries_the_subset(self):
        answer = Approval(approver="alice", decision="approve", candidates=[1])
        verdict = judge(answer, request(), now=BEFORE)
        assert (verdict.verdict, verdict.candidates) == ("approved", (1,))

    def test_a_subset_naming_a_candidate_outside_the_batch_approves_nothing(self):
        answer = Approval.model_construct(
            approver="alice", decision="approve", comment="", batch_size=None, candidates=[2]
        )
        assert judge(answer, request(), now=BEFORE).verdict == "not_allowed"


class TestTheBatchTableNumbering:
    def test_a_batch_thinned_by_candidate_rules_shows_each_row_s_name_in_inspect(self):
        thinned = request(
            proposed=[[0.1], [0.2], [0.3]],
            origins=(("proposal", 0), ("proposal", 2), ("fallback", 1)),
        )
        text = describe(thinned)
        assert "| # | candidate | in `inspect` |" in text
        assert "| 1 | 0.2 | proposal 2 |" in text
        assert "| 2 | 0.3 | fallback 1 |" in text

    def test_an_untouched_batch_keeps_two_columns_and_lists_every_row(self):
        size = 20
        whole = request(
            proposed=[[i / 100] for i in range(size)],
            origins=tuple(("proposal", i) for i in range(size)),
        )
        text = describe(whole)
        assert "in `inspect`" not in text
        assert f"| {size - 1} | 0.19 |" in text


class TestOverridesAreExplicit:
    def test_with_overrides_off_the_form_takes_no_batch_size(self):
        form = approval_form(batch_size=8, description="d", allow_override=False)
        with pytest.raises(ValidationError):
            form.model_validate({"approver": "alice", "decision": "approve", "batch_size": 1})

    def test_with_overrides_off_an_override_that_gets_through_approves_nothing(self):
        """Planted past the form: refused with its reason, never approved then ignored."""
        answer = Approval.model_validate(
            {"approver": "alice", "decision": "approve", "batch_size": 1}
        )
        judgement = judge(answer, request(allow_override=False), now=BEFORE)
        assert (judgement.verdict, judgement.refusal) == ("not_allowed", "override_not_allowed")

    def test_a_batch_size_and_candidates_together_are_refused(self):
        answer = Approval.model_validate(
            {"approver": "alice", "decision": "approve", "batch_size": 2, "candidates": [0, 1]}
        )
        judgement = judge(answer, request(), now=BEFORE)
        assert (judgement.verdict, judgement.refusal) == ("not_allowed", "override_ambiguous")

    def test_a_batch_size_beyond_the_batch_approves_nothing(self):
        answer = Approval.model_validate(
            {"approver": "alice", "decision": "approve", "batch_size": 99}
        )
        judgement = judge(answer, request(), now=BEFORE)
        assert (judgement.verdict, judgement.refusal) == ("not_allowed", "override_out_of_range")

    def test_a_rejection_needs_no_override_check(self):
        answer = Approval.model_validate(
            {"approver": "alice", "decision": "reject", "batch_size": 1}
        )
        assert judge(answer, request(allow_override=False), now=BEFORE).verdict == "rejected"
