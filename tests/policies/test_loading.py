"""Loading policies from TOML: good files build, bad ones fail at load naming file, rule, field."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from policies import (
    Policy,
    RoundContext,
    Severity,
    SoftBlockMode,
    SpecInvalid,
    Suspend,
    load_policy,
    policy_from_dict,
)

MakeContext = Callable[..., RoundContext]

GOOD = """
[policy]
name = "demo"
max_soft_attempts = 3
soft_block_mode = "cumulative"
escalate_to = "ASK"
latch_stop = true

[[rules]]
name = "expensive-batch"
description = "A batch above 4 node-hours needs a human."
advice = "Propose fewer candidates, or wait for approval."
severity = "ASK"
when = "batch.node_hours > 4.0"
approvers = ["alice"]

[[rules]]
name = "late-round"
severity = "SOFT_BLOCK"
when = "round.index >= 2 && allocation.has_walltime && allocation.walltime_remaining < 900.0"
log_only = true
"""

RULE = """
[[rules]]
name = "r1"
severity = "HARD_STOP"
when = "batch.node_hours > 4.0"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> SpecInvalid:
    path = write(tmp_path, text)
    with pytest.raises(SpecInvalid) as caught:
        load_policy(path)
    error = caught.value
    assert error.details["file"] == str(path)
    assert str(path) in error.message
    return error


class TestLoadGoodFile:
    def test_settings_are_read(self, tmp_path: Path) -> None:
        policy = load_policy(write(tmp_path, GOOD))
        assert policy.name == "demo"
        assert policy.escalate_to is Severity.ASK
        assert policy.soft_block_mode is SoftBlockMode.CUMULATIVE
        assert policy.latch_stop
        assert [r.name for r in policy.rules] == ["expensive-batch", "late-round"]
        assert policy.rules[1].log_only

    def test_loaded_policy_judges_rounds(self, tmp_path: Path, make_ctx: MakeContext) -> None:
        policy = load_policy(write(tmp_path, GOOD))
        decision = policy.decide_and_count(make_ctx(node_hours=4.5))
        assert decision.outcome == Suspend(decision.outcome.reason, ("alice",))
        assert "Propose fewer candidates" in decision.feedback

    def test_ask_without_approvers_loads_without_warnings(self, tmp_path: Path) -> None:
        text = RULE.replace("HARD_STOP", "ASK")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            policy = load_policy(write(tmp_path, text))
        assert policy.rules[0].approvers == ()

    def test_rules_only_file_uses_defaults(self, tmp_path: Path) -> None:
        policy = load_policy(write(tmp_path, RULE))
        assert policy.name == "policy"
        assert policy.max_soft_attempts == 3
        assert policy.escalate_to is Severity.HARD_STOP


class TestPolicyFromDict:
    def test_file_shape(self) -> None:
        data = {
            "policy": {"name": "x"},
            "rules": [{"name": "r", "severity": "ASK", "when": "true"}],
        }
        assert isinstance(policy_from_dict(data), Policy)

    def test_embedded_shape_from_a_campaign_spec(self) -> None:
        data = {
            "name": "embedded",
            "latch_stop": True,
            "rules": [{"name": "r", "severity": "TOLERATE", "when": "true"}],
        }
        policy = policy_from_dict(data, source="campaign.toml [policy]")
        assert policy.name == "embedded"
        assert policy.latch_stop

    def test_errors_name_the_source(self) -> None:
        with pytest.raises(SpecInvalid) as caught:
            policy_from_dict({"rules": [{"name": "r"}]}, source="campaign.toml [policy]")
        assert caught.value.details["file"] == "campaign.toml [policy]"
        assert caught.value.details["rule"] == "r"


class TestLoadBadFile:
    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(SpecInvalid) as caught:
            load_policy(tmp_path / "absent.toml")
        assert "not found" in caught.value.message
        assert caught.value.details["file"].endswith("absent.toml")

    def test_bad_toml_names_the_position(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, "[policy]\nname = \n")
        assert "line 2" in error.message

    def test_unknown_rule_field(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, RULE + 'sevrity = "ASK"\n')
        assert error.details == {"file": error.details["file"], "rule": "r1", "field": "sevrity"}
        assert "'r1'" in error.message
        assert "'sevrity'" in error.message

    def test_unknown_policy_field(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, "[policy]\nmax_attempts = 3\n" + RULE)
        assert error.details["rule"] is None
        assert error.details["field"] == "max_attempts"

    def test_unknown_table(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, "[polcy]\nname = 'x'\n")
        assert error.details["field"] == "polcy"

    def test_bad_severity(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, RULE.replace("HARD_STOP", "MAYBE"))
        assert (error.details["rule"], error.details["field"]) == ("r1", "severity")

    def test_missing_when(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, '[[rules]]\nname = "r1"\nseverity = "ASK"\n')
        assert (error.details["rule"], error.details["field"]) == ("r1", "when")

    def test_rule_without_name_is_named_by_position(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, RULE + '[[rules]]\nseverity = "ASK"\nwhen = "true"\n')
        assert (error.details["rule"], error.details["field"]) == ("#2", "name")

    @pytest.mark.parametrize(
        ("when", "problem"),
        [
            ("batch.node_hours >", "not a valid CEL expression"),
            ("batch.size + 1", "must yield a bool, got int"),
            ("budget.remaining", "must yield a bool, got float"),
            ("nodes > 4", "unknown variable 'nodes'"),
            ("batch.nodehours > 4.0", "unknown field 'batch.nodehours'"),
            ("false && round.idx > 1", "unknown field 'round.idx'"),
            ("round.index / 0 > 1", "failed on a sample round"),
        ],
    )
    def test_bad_expression_fails_at_load(self, tmp_path: Path, when: str, problem: str) -> None:
        error = load_error(tmp_path, RULE.replace("batch.node_hours > 4.0", when))
        assert (error.details["rule"], error.details["field"]) == ("r1", "when")
        assert problem in error.message

    def test_duplicate_rule_name(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, RULE + RULE)
        assert (error.details["rule"], error.details["field"]) == ("r1", "name")
        assert "duplicate" in error.message

    def test_escalate_to_must_stop_or_ask(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, '[policy]\nescalate_to = "TOLERATE"\n' + RULE)
        assert error.details["field"] == "escalate_to"

    def test_out_of_bounds_setting(self, tmp_path: Path) -> None:
        error = load_error(tmp_path, "[policy]\nmax_soft_attempts = 0\n" + RULE)
        assert error.details["field"] == "max_soft_attempts"

    def test_bad_value_is_not_quoted(self, tmp_path: Path) -> None:
        canary = "sk-CANARY-7f3a9"
        error = load_error(tmp_path, RULE + f'approvers = "{canary}"\n')
        assert error.details["field"] == "approvers"
        assert canary not in error.message
        assert canary not in repr(error.to_dict())
