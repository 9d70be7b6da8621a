"""Every answer to an approval form is judged: accepted or refused with a reason, never a crash.

Hypothesis sends arbitrary JSON (any Unicode, any type, any size, any field name)
down the same path a real answer takes: the server's check against the form's
JSON schema (a refusal there leaves the run suspended), the flow's load of the
input into the form's model (an input it cannot read becomes an
``UnreadableAnswer``), then the real ``judge`` with real one-time codes.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pyotp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from flows._engine._approval import ApprovalRequest, UnreadableAnswer, judge
from flows._engine._proof import ApproverCodes
from flows._prefect._approval_form import approval_form

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
VERDICTS = {"approved", "rejected", "not_allowed", "timeout"}
FIELDS = ["decision", "approver", "comment", "batch_size", "code", "candidates"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=24,
)
# Fields of the form with values of the right shape, so answers often pass the form and
# reach the judge: names differing in case or script, codes in other scripts' digits.
plausible = st.fixed_dictionaries(
    {
        "decision": st.sampled_from(["approve", "reject", "APPROVE", "maybe"]),
        "approver": st.sampled_from(["alice", "Alice", " alice ", "bob", "mallory", "аlice", ""])
        | st.text(max_size=120),
        "code": st.text(alphabet="0123456789٠١٢٣٤٥٦٧٨٩０１２ ", max_size=9),
    },
    optional={
        "comment": st.text(max_size=3000),
        "batch_size": st.integers(min_value=-2, max_value=10) | json_values,
        "candidates": st.lists(st.integers(min_value=-1, max_value=5), max_size=6) | json_values,
    },
)
answers = plausible | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values)


def _request(*, require_proof: bool, allow_override: bool) -> ApprovalRequest:
    return ApprovalRequest(
        campaign="judge",
        round_index=2,
        call_index=1,
        rule="review",
        reason="round.index == 2",
        advice="",
        approvers=("alice", "bob"),
        proposed=[[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]],
        fallback=[[0.0, 0.0]] * 4,
        node_hours=4.0,
        budget_remaining=60.0,
        disposition="accepted",
        deadline=NOW + timedelta(hours=1),
        require_proof=require_proof,
        allow_override=allow_override,
    )


@pytest.fixture(scope="module")
def codes(tmp_path_factory: pytest.TempPathFactory) -> ApproverCodes:
    folder: Path = tmp_path_factory.mktemp("approvers")
    folder.chmod(0o700)
    found = ApproverCodes(folder)
    found.enroll("alice")
    return found


def _alice_code(codes: ApproverCodes) -> str:
    secret = codes.secret_path("alice").read_text().strip()
    base64.b32decode(secret)  # a real TOTP secret
    return pyotp.TOTP(secret).at(NOW)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=answers, require_proof=st.booleans(), allow_override=st.booleans())
def test_any_answer_is_accepted_or_refused_never_an_error(
    codes: ApproverCodes, raw: dict, require_proof: bool, allow_override: bool
) -> None:
    request = _request(require_proof=require_proof, allow_override=allow_override)
    form = approval_form(
        batch_size=4, description="d", allow_override=allow_override, require_code=require_proof
    )
    try:
        jsonschema.validate(raw, form.model_json_schema())
    except jsonschema.ValidationError:
        return  # the server refuses it: the run stays suspended, nothing is recorded
    try:
        answer = form.model_validate(raw)
    except ValidationError as exc:
        answer = UnreadableAnswer(reason=type(exc).__name__)  # as flows._prefect._campaign does
    judgement = judge(answer, request, now=NOW, verify=codes.verify)
    assert judgement.verdict in VERDICTS
    if judgement.verdict in {"approved", "rejected"}:
        assert judgement.approver in request.approvers
        if require_proof:
            assert judgement.proof == "totp ok"
    if judgement.verdict == "approved":
        if judgement.candidates:
            assert allow_override
            assert all(0 <= i < 4 for i in judgement.candidates)
        if judgement.batch_size is not None:
            assert 1 <= judgement.batch_size <= 4


class TestCodesOfOtherScripts:
    def test_arabic_indic_digits_are_refused_by_the_form(self) -> None:
        form = approval_form(batch_size=4, description="d", allow_override=True, require_code=True)
        raw = {"decision": "approve", "approver": "alice", "code": "١٢٣٤٥٦"}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(raw, form.model_json_schema())

    def test_and_judged_not_proven_if_they_reach_the_flow(self, codes: ApproverCodes) -> None:
        """An answer planted past the server's check fails its proof; it does not crash."""
        answer = approval_form(batch_size=4, description="d", allow_override=True).model_validate(
            {"decision": "approve", "approver": "alice", "code": "١٢٣٤٥٦"}
        )
        judgement = judge(
            answer, _request(require_proof=True, allow_override=True), now=NOW, verify=codes.verify
        )
        assert (judgement.verdict, judgement.proof) == ("not_allowed", "totp failed")

    def test_the_right_code_still_proves_alice(self, codes: ApproverCodes) -> None:
        answer = approval_form(
            batch_size=4, description="d", allow_override=True, require_code=True
        ).model_validate({"decision": "approve", "approver": "alice", "code": _alice_code(codes)})
        judgement = judge(
            answer, _request(require_proof=True, allow_override=True), now=NOW, verify=codes.verify
        )
        assert (judgement.verdict, judgement.proof) == ("approved", "totp ok")


def test_an_unreadable_answer_is_refused_with_its_reason() -> None:
    judgement = judge(
        UnreadableAnswer(reason="ValidationError"),
        _request(require_proof=False, allow_override=True),
        now=NOW,
    )
    assert judgement.verdict == "not_allowed"
    assert "could not be read (ValidationError)" in judgement.comment
