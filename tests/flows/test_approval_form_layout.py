"""The approval form a tired approver cannot misread: what it offers, says and accepts.

Checked on the schema the server validates against (``jsonschema``, as Prefect does)
and on the markdown the UI shows; the browser tests check the same in Chromium.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import jsonschema
import pytest
from prefect._internal.pydantic.v2_schema import create_v2_schema
from pydantic import ValidationError

from flows._engine._approval import (
    SYSTEM_TIMEOUT_APPROVER,
    ApprovalRequest,
    candidate_labels,
    describe,
    judge,
)
from flows._prefect._approval_form import approval_form

DEADLINE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
BEFORE = DEADLINE - timedelta(minutes=5)


def request(**changes: object) -> ApprovalRequest:
    values: dict[str, object] = {
        "campaign": "demo",
        "round_index": 2,
        "call_index": 1,
        "rule": "review-round-2",
        "reason": "Round 2 moves from exploring to exploiting.",
        "condition": "`round.index == 2` held (round.index=2)",
        "advice": "Approve to run it, reject to stop the campaign.",
        "approvers": ("alice", "bob"),
        "proposed": [[0.1, 0.25], [0.3, 0.4], [0.6, 0.42]],
        "predictions": (1.5, None, 0.18021),
        "fallback": [[0.5, 0.5], [0.6, 0.6], [0.7, 0.7]],
        "node_hours": 3.0,
        "fallback_node_hours": 3.0,
        "budget_remaining": 60.0,
        "best_so_far": 0.0123,
        "rationale": "Exploit near [the best](http://evil.example) `x`",
        "disposition": "accepted",
        "deadline": DEADLINE,
    }
    return ApprovalRequest(**(values | changes))  # type: ignore[arg-type]


def form_for(req: ApprovalRequest) -> type:
    return approval_form(
        batch_size=len(req.proposed),
        description=describe(req),
        allow_override=req.allow_override,
        require_code=req.require_proof,
        approvers=req.approvers,
        labels=candidate_labels(req),
    )


def stored_schema(req: ApprovalRequest) -> dict:
    """Return the schema as Prefect stores it for the UI and the server."""
    return create_v2_schema("Approval", model_base=form_for(req))


def refused(raw: dict, req: ApprovalRequest) -> bool:
    try:
        jsonschema.validate(raw, stored_schema(req))
    except jsonschema.ValidationError:
        return True
    return False


ALICE = {"decision": "approve", "approver": "alice"}


class TestTheRows:
    def test_each_row_shows_its_number_coordinates_and_prediction(self):
        assert candidate_labels(request()) == [
            "#0: (0.1, 0.25), predicted 1.5",
            "#1: (0.3, 0.4)",  # the verifier made no prediction for it
            "#2: (0.6, 0.42), predicted 0.1802",
        ]

    def test_picked_rows_are_read_back_as_their_numbers(self):
        req = request()
        labels = candidate_labels(req)
        raw = ALICE | {"candidates": [labels[2], labels[0]]}
        assert not refused(raw, req)
        answer = form_for(req).model_validate(raw)
        assert judge(answer, req, now=BEFORE).candidates == (2, 0)

    def test_a_row_the_form_does_not_offer_is_refused(self):
        req = request()
        assert refused(ALICE | {"candidates": ["#3: (0.9, 0.9)"]}, req)
        assert refused(ALICE | {"candidates": [0]}, req)  # a bare number is no row
        with pytest.raises(ValidationError):
            form_for(req).model_validate(ALICE | {"candidates": ["#3: (0.9, 0.9)"]})


class TestTheApprover:
    def test_is_a_choice_of_the_allowed_names_then_the_runner_s(self):
        schema = stored_schema(request())["properties"]["approver"]
        assert schema["enum"] == ["alice", "bob", SYSTEM_TIMEOUT_APPROVER]

    @pytest.mark.parametrize("name", ["Alice", "mallory", " alice", "alice\u200b", ""])
    def test_another_name_is_no_answer(self, name: str):
        assert refused({"decision": "approve", "approver": name}, request())

    def test_the_runner_s_answer_to_an_expired_request_is_taken(self):
        raw = {"decision": "reject", "approver": SYSTEM_TIMEOUT_APPROVER, "comment": "late"}
        assert not refused(raw, request())
        answer = form_for(request()).model_validate(raw)
        assert judge(answer, request(), now=DEADLINE).verdict == "timeout"
        assert judge(answer, request(), now=BEFORE).verdict == "not_allowed"


class TestTheFields:
    def test_the_fields_to_fill_come_first_and_optional_numbers_have_no_type_tabs(self):
        properties = stored_schema(request(require_proof=True))["properties"]
        order = sorted(properties, key=lambda name: properties[name]["position"])
        assert order == ["decision", "approver", "code", "candidates", "batch_size", "comment"]
        assert "anyOf" not in properties["batch_size"]
        assert (properties["batch_size"]["minimum"], properties["batch_size"]["maximum"]) == (1, 3)
        assert "anyOf" not in properties["candidates"]

    def test_a_plain_rule_has_no_code_field_and_takes_no_code(self):
        schema = stored_schema(request())
        assert "code" not in schema["properties"]
        assert refused(ALICE | {"code": "123456"}, request())

    def test_a_rule_that_requires_proof_requires_the_code(self):
        req = request(require_proof=True)
        assert "code" in stored_schema(req)["required"]
        assert refused(ALICE, req)
        assert refused(ALICE | {"code": ""}, req)
        assert refused(ALICE | {"code": "12345"}, req)
        assert not refused(ALICE | {"code": "123456"}, req)

    def test_the_runner_answers_an_expired_proof_request_without_a_code(self):
        # expire_approvals sends no code (it has none): the server must take the answer,
        # or a rule that requires proof would never time out.
        req = request(require_proof=True)
        raw = {"decision": "reject", "approver": SYSTEM_TIMEOUT_APPROVER, "code": ""}
        assert not refused(raw, req)
        answer = form_for(req).model_validate(raw)
        assert judge(answer, req, now=DEADLINE).verdict == "timeout"
        assert judge(answer, req, now=BEFORE).verdict == "not_allowed"

    def test_with_overrides_off_no_row_and_no_number_is_taken(self):
        req = request(allow_override=False)
        assert refused(ALICE | {"candidates": [candidate_labels(req)[0]]}, req)
        assert refused(ALICE | {"batch_size": 1}, req)
        assert not refused(ALICE, req)


class TestTheDescription:
    def test_says_once_what_each_answer_does_and_why_in_words_then_the_condition(self):
        text = describe(request())
        top = text.split("<details>")[0]
        for said_once in ("**Approve**", "**Reject**", "**No answer by", "round.index == 2"):
            assert text.count(said_once) == 1, said_once
        assert "**Why it asks** (rule `review-round-2`): Round 2 moves from exploring" in top
        assert "Condition: `round.index == 2` held (round.index=2)." in top
        assert "2026-11-29 12:00 UTC" in top
        assert "runs the proposed batch: 3 candidates, 3 node-hours" in top
        assert "( " not in top  # no raw expression in nested brackets

    def test_folds_the_rationale_predictions_best_so_far_and_both_costs(self):
        details = describe(request()).split("<details>")[1]
        assert "**Planner's rationale:** `Exploit near [the best](http://evil.example) 'x'`" in (
            details
        )
        assert "**Best result so far:** 0.0123" in details
        assert "this batch 3 node-hours; the fallback batch 3" in details
        assert "| # | candidate | verifier predicts |" in details
        assert "| 1 | 0.3, 0.4 | – |" in details
        assert "| 2 | 0.6, 0.42 | 0.1802 |" in details

    def test_a_rule_with_proof_says_so_above_the_fields(self):
        top = describe(request(require_proof=True)).split("<details>")[0]
        assert "**This rule requires proof:**" in top

    def test_the_deadline_is_given_in_the_login_node_s_zone_when_it_is_not_utc(
        self, monkeypatch: pytest.MonkeyPatch
    ):
        monkeypatch.setenv("TZ", "Europe/Berlin")
        time.tzset()
        try:
            top = describe(request()).split("<details>")[0]
        finally:
            monkeypatch.undo()
            time.tzset()
        assert "2026-11-29 12:00 UTC (13:00 CET on the login node)" in top
