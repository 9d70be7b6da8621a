"""An answer is judged as who the server authenticated: the stamp only the server writes.

The form the flow reads an answer with carries ``authenticated_as`` (``approver:NAME``
or ``owner``), stamped by the server's identity layer; the UI never shows it and the
server replaces any a client sends. These check the flow's side with the real form
model, its stored schema and ``judge``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jsonschema

from flows._engine._approval import ApprovalRequest, judge
from flows._prefect._approval_form import approval_form

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
REQUEST = ApprovalRequest(
    campaign="who",
    round_index=2,
    call_index=1,
    rule="review",
    reason="round.index == 2",
    advice="",
    approvers=("alice", "bob"),
    proposed=[[0.1], [0.2]],
    fallback=[[0.0]] * 2,
    node_hours=2.0,
    budget_remaining=60.0,
    disposition="accepted",
    deadline=NOW + timedelta(hours=1),
)
FORM = approval_form(
    batch_size=2, description="d", allow_override=True, approvers=REQUEST.approvers
)


def _judged(**answer: str) -> tuple[str, str, str | None, str | None]:
    found = judge(FORM(**answer), REQUEST, now=NOW)
    return found.verdict, found.approver, found.proof, found.refusal


class TestTheStamp:
    def test_is_not_a_field_of_the_form_yet_the_server_admits_it(self) -> None:
        schema = FORM.model_json_schema()
        stamped = {"decision": "approve", "approver": "alice", "authenticated_as": "owner"}

        assert "authenticated_as" not in schema["properties"]  # the UI renders no such field
        jsonschema.validate(stamped, schema)  # what the server checks a resume against

    def test_an_approvers_own_login_is_recorded_as_a_login(self) -> None:
        verdict = _judged(decision="approve", approver="alice", authenticated_as="approver:alice")
        assert verdict == ("approved", "alice", "login", None)

    def test_an_answer_naming_another_than_the_login_is_refused(self) -> None:
        verdict = _judged(decision="approve", approver="bob", authenticated_as="approver:alice")
        assert verdict == ("not_allowed", "bob", None, "not_who_logged_in")

    def test_the_owner_answering_on_an_approvers_behalf_is_recorded_as_the_owner(self) -> None:
        verdict = _judged(decision="reject", approver="bob", authenticated_as="owner")
        assert verdict == ("rejected", "bob", "owner", None)

    def test_a_server_without_logins_stamps_nothing_and_nothing_is_claimed(self) -> None:
        assert _judged(decision="approve", approver="bob") == ("approved", "bob", None, None)
