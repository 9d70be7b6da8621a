"""Per-approver one-time codes: enrolment, verification, replay, and how the flow judges them."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pyotp
import pytest
from pydantic import ValidationError

from flows._cli import main
from flows._engine._approval import ApprovalRequest, judge
from flows._engine._proof import ApproverCodes
from flows._prefect._approval_form import Approval, approval_form
from policies import (
    BatchSummary,
    RoundContext,
    SpecInvalid,
    Suspend,
    policy_from_dict,
    proposal_key,
)

NOW = datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC)  # 10 s into a 30 s step


def enrolled(tmp_path: Path, name: str = "alice") -> tuple[ApproverCodes, pyotp.TOTP]:
    codes = ApproverCodes(tmp_path / "approvers")
    uri = codes.enroll(name)
    return codes, pyotp.TOTP(parse_qs(urlsplit(uri).query)["secret"][0])


class TestEnrol:
    def test_the_secret_is_a_0600_file_in_a_0700_folder_and_the_uri_names_the_approver(
        self, tmp_path: Path
    ) -> None:
        codes = ApproverCodes(tmp_path / "approvers")
        uri = codes.enroll("alice")
        assert uri.startswith("otpauth://totp/unattended:alice?secret=")
        assert codes.secret_path("alice").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "approvers").stat().st_mode & 0o777 == 0o700

    def test_enrolling_twice_is_refused_unless_replaced(self, tmp_path: Path) -> None:
        codes, first = enrolled(tmp_path)
        with pytest.raises(SpecInvalid, match="enrolled already"):
            codes.enroll("alice")
        codes.enroll("alice", replace=True)
        assert codes.verify("alice", first.at(NOW), NOW) == "totp failed"

    @pytest.mark.parametrize("name", ["../bob", ".hidden", "a/b", ""])
    def test_a_name_that_is_not_a_safe_file_name_is_refused(
        self, tmp_path: Path, name: str
    ) -> None:
        with pytest.raises(SpecInvalid, match="cannot be enrolled"):
            ApproverCodes(tmp_path).enroll(name)

    def test_the_cli_shows_the_uri_once_and_keeps_the_secret(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        assert main(["approvers", "code", "bob"]) == 0
        out = capsys.readouterr().out
        assert "otpauth://totp/unattended:bob?secret=" in out
        assert (tmp_path / "approvers" / "bob.totp").stat().st_mode & 0o777 == 0o600
        assert main(["approvers", "code", "bob"]) == 2  # no second secret by accident

    def test_the_first_spelling_approver_add_still_enrols(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``approver add NAME`` (hidden from --help) is ``approvers code NAME``."""
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        assert main(["approver", "add", "bob"]) == 0
        assert "otpauth://totp/unattended:bob?secret=" in capsys.readouterr().out
        assert main(["approvers", "code", "bob", "--replace"]) == 0
        assert main(["approver", "add", "bob"]) == 2  # the same secret file, the same refusal


class TestVerify:
    def test_the_current_code_proves_the_approver(self, tmp_path: Path) -> None:
        codes, totp = enrolled(tmp_path)
        assert codes.verify("alice", totp.at(NOW), NOW) == "totp ok"

    def test_a_wrong_code_fails(self, tmp_path: Path) -> None:
        codes, totp = enrolled(tmp_path)
        wrong = f"{(int(totp.at(NOW)) + 1) % 1_000_000:06d}"
        assert codes.verify("alice", wrong, NOW) == "totp failed"

    def test_a_used_code_is_refused_within_its_window(self, tmp_path: Path) -> None:
        codes, totp = enrolled(tmp_path)
        code = totp.at(NOW)
        assert codes.verify("alice", code, NOW) == "totp ok"
        assert codes.verify("alice", code, NOW + timedelta(seconds=5)) == "totp replayed"

    def test_the_previous_step_is_accepted_for_clock_skew_but_not_older(
        self, tmp_path: Path
    ) -> None:
        codes, totp = enrolled(tmp_path)
        assert codes.verify("alice", totp.at(NOW - timedelta(seconds=30)), NOW) == "totp ok"
        assert codes.verify("bob", "123456", NOW) == "totp not enrolled"
        codes.enroll("carol")
        carol = pyotp.TOTP(codes.secret_path("carol").read_text().strip())
        assert codes.verify("carol", carol.at(NOW - timedelta(seconds=90)), NOW) == "totp failed"

    def test_an_empty_code_is_missing(self, tmp_path: Path) -> None:
        codes, _ = enrolled(tmp_path)
        assert codes.verify("alice", "  ", NOW) == "totp missing"

    def test_a_secret_file_others_can_read_proves_nothing(self, tmp_path: Path) -> None:
        codes, totp = enrolled(tmp_path)
        codes.secret_path("alice").chmod(0o644)
        assert codes.verify("alice", totp.at(NOW), NOW) == "totp secret exposed"


def _request(require_proof: bool) -> ApprovalRequest:
    return ApprovalRequest(
        campaign="demo",
        round_index=2,
        call_index=1,
        rule="review-round-2",
        reason="r",
        advice="a",
        approvers=("alice", "bob"),
        proposed=[[0.1, 0.2]],
        fallback=[[0.5, 0.5]],
        node_hours=1.0,
        budget_remaining=10.0,
        disposition="accepted",
        deadline=NOW + timedelta(hours=1),
        require_proof=require_proof,
    )


class TestJudgeWithProof:
    def test_a_right_code_approves_and_records_the_proof_not_the_code(self, tmp_path: Path) -> None:
        codes, totp = enrolled(tmp_path)
        answer = Approval(approver="alice", decision="approve", code=totp.at(NOW))
        verdict = judge(answer, _request(True), now=NOW, verify=codes.verify)
        assert (verdict.verdict, verdict.proof) == ("approved", "totp ok")
        assert totp.at(NOW) not in repr(verdict)

    def test_a_wrong_code_is_not_allowed_whatever_was_chosen(self, tmp_path: Path) -> None:
        codes, _ = enrolled(tmp_path)
        for decision in ("approve", "reject"):
            answer = Approval(approver="alice", decision=decision, code="000000")
            verdict = judge(answer, _request(True), now=NOW, verify=codes.verify)
            assert (verdict.verdict, verdict.proof) == ("not_allowed", "totp failed")

    def test_without_a_way_to_verify_the_flow_fails_closed(self) -> None:
        verdict = judge(
            Approval(approver="alice", decision="approve", code="123456"), _request(True), now=NOW
        )
        assert (verdict.verdict, verdict.proof) == ("not_allowed", "totp not enrolled")

    def test_a_rule_without_proof_ignores_the_code(self) -> None:
        verdict = judge(Approval(approver="alice", decision="approve"), _request(False), now=NOW)
        assert (verdict.verdict, verdict.proof) == ("approved", None)


POLICY = """
[[rules]]
name = "review"
severity = "{severity}"
when = "round.index == 2"
approvers = ["alice"]
require_proof = true
"""


class TestThePolicyOption:
    def test_an_ask_rule_that_requires_proof_suspends_asking_for_it(self) -> None:
        policy = policy_from_dict(tomllib.loads(POLICY.format(severity="ASK")), source="p.toml")
        rows = [[0.1, 0.2], [0.3, 0.4]]

        def round_context(index: int) -> RoundContext:
            return RoundContext(
                campaign="proof",
                round_index=index,
                attempt=1,
                batch=BatchSummary(size=len(rows), candidates=rows, node_hours=1.0),
                proposal_key=proposal_key(rows),
                disposition="accepted",
                consecutive_fallbacks=0,
                budget_spent=0.0,
                budget_remaining=100.0,
            )

        assert policy.decide_and_count(round_context(1)).outcome.kind == "continue"
        outcome = policy.decide_and_count(round_context(2)).outcome
        assert isinstance(outcome, Suspend)
        assert outcome.approvers == ("alice",)
        assert outcome.require_proof  # the answer counts only with alice's code

    def test_a_rule_that_cannot_ask_is_refused_naming_the_field(self) -> None:
        with pytest.raises(SpecInvalid, match=r"p\.toml.*require_proof"):
            policy_from_dict(tomllib.loads(POLICY.format(severity="HARD_STOP")), source="p.toml")

    def test_merged_suspends_require_proof_if_any_does(self) -> None:
        from policies._outcomes import combine

        merged = combine(Suspend("a", ("alice",), True), Suspend("b", ("bob",)))
        assert isinstance(merged, Suspend)
        assert merged.require_proof


class TestTheForm:
    def test_a_rule_with_proof_makes_the_code_a_required_six_digit_field(self) -> None:
        form = approval_form(batch_size=8, description="d", allow_override=True, require_code=True)
        assert "code" in form.model_json_schema()["required"]
        assert (
            form.model_validate({"approver": "a", "decision": "approve", "code": "123456"}).code
            == "123456"
        )
        for bad in (
            {"approver": "a", "decision": "approve"},
            {"approver": "a", "decision": "approve", "code": "12345x"},
        ):
            with pytest.raises(ValidationError):
                form.model_validate(bad)
