"""The campaign spec: good files load, every malformed one is refused naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from flows._spec import load_campaign, spec_from_dict
from policies import SpecInvalid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


def base() -> dict:
    return {
        "name": "demo",
        "seed": 1,
        "rounds": 2,
        "batch_size": 4,
        "attempts": 2,
        "budget_node_hours": 10.0,
        "objective": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]},
        "planner": {"kind": "surrogate"},
    }


def with_change(path: str, value) -> dict:
    data = base()
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return data


_DELETE = object()

# (dotted path changed, new value, the field the error must name)
MALFORMED = [
    ("name", "Has Spaces", "name"),
    ("name", "", "name"),
    ("name", _DELETE, "name"),
    ("name", 42, "name"),
    ("seed", -1, "seed"),
    ("seed", "seven", "seed"),
    ("rounds", 0, "rounds"),
    ("rounds", 10**9, "rounds"),
    ("rounds", _DELETE, "rounds"),
    ("batch_size", 0, "batch_size"),
    ("batch_size", 1.5, "batch_size"),
    ("attempts", 0, "attempts"),
    ("attempts", 1000, "attempts"),
    ("policy_retries", -1, "policy_retries"),
    ("budget_node_hours", 0, "budget_node_hours"),
    ("budget_node_hours", float("nan"), "budget_node_hours"),
    ("budget_node_hours", float("inf"), "budget_node_hours"),
    ("objective", _DELETE, "objective"),
    ("objective.lower", [], "objective.lower"),
    ("objective.lower", [0.0], "objective.upper"),
    ("objective.upper", [0.0, 0.0], "objective.upper"),
    ("objective.upper", [float("nan"), 1.0], "objective.upper"),
    ("objective.lower", ["a", 0.0], "objective.lower.0"),
    ("objective.simulation", "magic", "objective.simulation"),
    ("objective.simulation_cost", -1, "objective.simulation_cost"),
    ("objective.unknown", 1, "objective.unknown"),
    ("planner", _DELETE, "planner"),
    ("planner.kind", "oracle", "planner.kind"),
    ("planner.kind", "scripted", "planner.transcript"),
    ("planner.kind", "llm", "planner.base_url"),
    ("planner.transcript", "t.jsonl", "planner.transcript"),  # not a surrogate planner's
    ("planner.api_key_env", "lower case", "planner.api_key_env"),
    ("planner.timeout", 0, "planner.timeout"),
    ("approvals.timeout_minutes", 0, "approvals.timeout_minutes"),
    ("approvals.on_timeout", "pray", "approvals.on_timeout"),
    ("approvals.approvers", [""], "approvals.approvers.0"),
    ("surprise", True, "surprise"),
    ("batch_size", True, "batch_size"),
    ("rounds", "3", "rounds"),
    ("budget_node_hours", True, "budget_node_hours"),
    ("objective.verifier_limit", float("nan"), "objective.verifier_limit"),
    ("objective.verifier_limit", float("inf"), "objective.verifier_limit"),
    ("objective.verifier_limit", False, "objective.verifier_limit"),
    ("objective.simulation", [], "objective.simulation"),
    ("objective.simulation", [" "], "objective.simulation"),
    ("allow_no_rules", "yes please", "allow_no_rules"),
]


class TestSpecFromDict:
    def test_a_minimal_spec_loads(self):
        spec = spec_from_dict(base())
        assert spec.dim == 2
        assert spec.approvals.on_timeout == "stop"

    @pytest.mark.parametrize(
        ("path", "value", "field"), MALFORMED, ids=[m[0] + ":" + repr(m[1])[:20] for m in MALFORMED]
    )
    def test_malformed_spec_is_refused_naming_the_field(self, path, value, field):
        with pytest.raises(SpecInvalid) as caught:
            spec_from_dict(with_change(path, value), source="campaign.toml")
        error = caught.value
        assert error.code == "spec_invalid"
        assert error.details["file"] == "campaign.toml"
        assert error.details["field"] == field
        assert f"'{field}'" in str(error)


class TestEveryProblem:
    def test_every_wrong_field_is_named_in_one_error(self):
        data = with_change("batch_size", True)
        data["rounds"] = 0
        data["objective"]["verifier_limit"] = float("nan")
        with pytest.raises(SpecInvalid) as caught:
            spec_from_dict(data, source="campaign.toml")
        message = str(caught.value)
        assert message.startswith("3 problems: campaign.toml: field ")
        for field in ("rounds", "batch_size", "objective.verifier_limit"):
            assert f"field '{field}'" in message
        assert caught.value.details["field"] == "rounds"

    def test_a_missing_transcript_and_policy_are_both_named(self, tmp_path):
        data = with_change("planner", {"kind": "scripted", "transcript": "gone.jsonl"})
        data["policy"] = "gone.toml"
        spec = tmp_path / "campaign.toml"
        spec.write_text(tomli_w.dumps(data))
        with pytest.raises(SpecInvalid) as caught:
            load_campaign(spec)
        fields = [p["field"] for p in caught.value.details["problems"]]
        assert fields == ["planner.transcript", "policy"]


class TestPlannerKinds:
    def test_a_field_of_another_kind_is_refused_naming_it_and_the_kind(self):
        planner = {"kind": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
        with pytest.raises(SpecInvalid) as caught:
            spec_from_dict(with_change("planner", {**planner, "transcript": "t.jsonl"}))
        assert caught.value.details["field"] == "planner.transcript"
        assert "not a field of the llm planner" in caught.value.message

    def test_each_kind_loads_as_its_own_model(self):
        llm = {"kind": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
        spec = spec_from_dict(with_change("planner", llm))
        assert type(spec.planner).__name__ == "LLMPlannerSpec"
        assert spec.planner.timeout == 60.0


class TestLoadCampaign:
    def test_the_demo_specs_load(self):
        assert load_campaign(EXAMPLES / "campaign.toml").spec.name == "demo"
        assert (
            load_campaign(EXAMPLES / "campaign-approval.toml").spec.policy == "approval-policy.toml"
        )

    def test_missing_file(self, tmp_path):
        with pytest.raises(SpecInvalid, match="no such file"):
            load_campaign(tmp_path / "nope.toml")

    def test_not_toml(self, tmp_path):
        bad = tmp_path / "bad.toml"
        bad.write_text("name = [unclosed")
        with pytest.raises(SpecInvalid, match="not valid TOML") as caught:
            load_campaign(bad)
        assert caught.value.details["file"] == str(bad)

    def test_not_utf8(self, tmp_path):
        bad = tmp_path / "bad.toml"
        bad.write_bytes(b"\xff\xfe\x00name")
        with pytest.raises(SpecInvalid, match="cannot read"):
            load_campaign(bad)

    def test_a_missing_transcript_is_refused_at_load(self, tmp_path):
        data = with_change("planner", {"kind": "scripted", "transcript": "missing.jsonl"})
        spec = tmp_path / "campaign.toml"
        spec.write_text(tomli_w.dumps(data))
        with pytest.raises(SpecInvalid) as caught:
            load_campaign(spec)
        assert caught.value.details["field"] == "planner.transcript"

    def test_a_missing_policy_file_is_refused_at_load(self, tmp_path):
        data = base() | {"policy": "policy.toml"}
        spec = tmp_path / "campaign.toml"
        spec.write_text(tomli_w.dumps(data))
        with pytest.raises(SpecInvalid) as caught:
            load_campaign(spec)
        assert caught.value.details["field"] == "policy"

    def test_a_broken_policy_file_is_refused_naming_the_policy_file(self, tmp_path):
        (tmp_path / "policy.toml").write_text(
            '[[rules]]\nname = "r"\nseverity = "SOMETIMES"\nwhen = "true"\n'
        )
        spec = tmp_path / "campaign.toml"
        spec.write_text(tomli_w.dumps(base() | {"policy": "policy.toml"}))
        with pytest.raises(SpecInvalid) as caught:
            load_campaign(spec)
        assert "policy.toml" in str(caught.value)

    def test_relative_paths_resolve_against_the_spec_folder(self, tmp_path):
        (tmp_path / "t.jsonl").write_text('{"answer": "{}"}\n')
        spec = tmp_path / "campaign.toml"
        spec.write_text(
            tomli_w.dumps(with_change("planner", {"kind": "scripted", "transcript": "t.jsonl"}))
        )
        loaded = load_campaign(spec)
        assert loaded.resolve("t.jsonl") == (tmp_path / "t.jsonl").resolve()
