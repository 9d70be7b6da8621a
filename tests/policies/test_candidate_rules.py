"""Candidate-scoped rules: each candidate judged alone, bad expressions refused at load."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from policies import CandidateView, RoundContext, SpecInvalid, load_policy, policy_from_dict

MakeContext = Callable[..., RoundContext]


def _policy(when: str, **rule: object) -> dict[str, object]:
    return {
        "policy": {"name": "p"},
        "rules": [
            {"name": "risky", "severity": "HARD_STOP", "scope": "candidate", "when": when, **rule}
        ],
    }


CANDIDATES = [
    CandidateView(index=0, x=[0.1, 0.2], prediction=1.0),
    CandidateView(index=1, x=[0.9, 0.2], prediction=7.0),
    CandidateView(index=2, x=[0.3, 0.8], prediction=2.0),
    CandidateView(index=3, x=[0.4, 0.4]),
]


class TestCandidateRules:
    def test_a_prediction_rule_refuses_exactly_the_matching_candidates(
        self, make_ctx: MakeContext
    ) -> None:
        policy = policy_from_dict(_policy("candidate.has_prediction && candidate.prediction > 5.0"))
        refused = policy.refuse_candidates(make_ctx(), CANDIDATES)
        assert list(refused) == [1]
        rule, reason = refused[1]
        assert rule == "risky"
        assert "candidate 1" in reason
        assert "candidate.prediction=7" in reason

    def test_a_coordinate_rule_reads_the_candidates_position(self, make_ctx: MakeContext) -> None:
        policy = policy_from_dict(_policy("candidate.x[1] > 0.5 || candidate.index == 3"))
        assert sorted(policy.refuse_candidates(make_ctx(), CANDIDATES)) == [2, 3]

    def test_a_candidate_rule_reads_the_rounds_maps_too(self, make_ctx: MakeContext) -> None:
        policy = policy_from_dict(_policy("round.index >= 2 && candidate.index == 0"))
        assert policy.refuse_candidates(make_ctx(round_index=1), CANDIDATES) == {}
        assert list(policy.refuse_candidates(make_ctx(round_index=2), CANDIDATES)) == [0]

    def test_a_candidate_rule_never_decides_the_round(self, make_ctx: MakeContext) -> None:
        policy = policy_from_dict(_policy("true"))
        assert policy.decide_and_count(make_ctx()).outcome.kind == "continue"

    def test_a_shadow_candidate_rule_refuses_nothing(self, make_ctx: MakeContext) -> None:
        policy = policy_from_dict(_policy("true", log_only=True))
        assert policy.refuse_candidates(make_ctx(), CANDIDATES) == {}

    def test_top_up_is_off_unless_the_policy_says_so(self) -> None:
        assert policy_from_dict(_policy("true")).top_up_from_fallback is False
        data = _policy("true")
        data["policy"] = {"name": "p", "top_up_from_fallback": True}
        policy = policy_from_dict(data)
        assert policy.top_up_from_fallback is True
        assert policy.with_state(None).top_up_from_fallback is True


class TestCandidateRulesAtLoad:
    def test_an_unknown_candidate_field_fails_at_load_naming_file_rule_and_field(self) -> None:
        with pytest.raises(SpecInvalid) as caught:
            policy_from_dict(_policy("candidate.score > 1.0"), source="p.toml")
        assert caught.value.details == {"file": "p.toml", "rule": "risky", "field": "when"}
        assert "unknown field 'candidate.score'" in caught.value.message

    def test_a_round_rule_cannot_read_a_candidate(self) -> None:
        data = _policy("candidate.index == 0")
        data["rules"][0]["scope"] = "round"  # type: ignore[index]
        with pytest.raises(SpecInvalid) as caught:
            policy_from_dict(data, source="p.toml")
        assert "unknown variable 'candidate'" in caught.value.message

    def test_a_candidate_rule_must_refuse(self) -> None:
        with pytest.raises(SpecInvalid) as caught:
            policy_from_dict(_policy("true", severity="ASK"), source="p.toml")
        assert caught.value.details["field"] == "severity"
        assert "rule 'risky'" in caught.value.message

    def test_an_unknown_scope_fails_at_load(self) -> None:
        with pytest.raises(SpecInvalid) as caught:
            policy_from_dict(_policy("true", scope="batch"), source="p.toml")
        assert caught.value.details["field"] == "scope"

    def test_a_non_bool_candidate_expression_fails_at_load(self) -> None:
        with pytest.raises(SpecInvalid) as caught:
            policy_from_dict(_policy("candidate.x"), source="p.toml")
        assert "must yield a bool" in caught.value.message


class TestTheDocsExample:
    def test_the_candidate_rule_example_loads_and_refuses_the_far_corner(
        self, make_ctx: MakeContext, tmp_path: Path
    ) -> None:
        doc = (Path(__file__).resolve().parents[2] / "docs" / "policies.md").read_text()
        section = doc[doc.index("## Candidate rules") :]
        found = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
        assert found is not None
        path = tmp_path / "policy.toml"
        path.write_text(found.group(1))
        policy = load_policy(path)
        assert policy.top_up_from_fallback is True
        assert sorted(policy.refuse_candidates(make_ctx(), CANDIDATES)) == [1]
