"""``unattended replay``: a changed policy judged against a real recorded campaign."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows._cli import main
from flows._provenance import ProvenanceStore
from flows._replay import NOT_REACHED, derive_node_hours, read_record, replay
from policies import load_policy

pytestmark = pytest.mark.timeout(120)

DEMO_APPROVAL_POLICY = (
    Path(__file__).resolve().parents[2] / "examples" / "demo" / "approval-policy.toml"
)

HARD_STOP_FROM_ROUND_2 = """
[policy]
name = "stricter"

[[rules]]
name = "stop-from-round-2"
severity = "HARD_STOP"
when = "round.index >= 2"
"""

ASK_IN_ROUND_1 = """
[policy]
name = "ask-early"

[[rules]]
name = "review-round-1"
severity = "ASK"
when = "round.index == 1"
approvers = ["carol"]
"""


def write_policy(tmp_path: Path, text: str, name: str = "new.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_replay(
    campaign: Any, policy: Path, capsys: pytest.CaptureFixture, *extra: str
) -> tuple[int, str, str]:
    argv = ["replay", campaign.name, "--policy", str(policy), "--db", str(campaign.database)]
    code = main([*argv, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def replay_json(campaign: Any, policy: Path, capsys: pytest.CaptureFixture, *extra: str) -> dict:
    code, out, err = run_replay(campaign, policy, capsys, "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def new_by_round(data: dict) -> dict[int, str]:
    """Return the new outcome of each round's last evaluated gate call."""
    return {step["round_index"]: step["new"] for step in data["steps"]}


class TestSamePolicy:
    def test_the_recorded_policy_changes_nothing(
        self, recorded_campaign: Any, capsys: pytest.CaptureFixture
    ) -> None:
        data = replay_json(
            recorded_campaign, recorded_campaign.folder / "approval-policy.toml", capsys
        )
        assert not any(step["differs"] for step in data["steps"])
        assert all(not rounds for rounds in data["differences"].values())
        assert (data["recorded_status"], data["new_status"]) == ("completed", "completed")

    def test_recorded_and_new_rules_match_call_by_call(
        self, recorded_campaign: Any, capsys: pytest.CaptureFixture
    ) -> None:
        data = replay_json(
            recorded_campaign, recorded_campaign.folder / "approval-policy.toml", capsys
        )
        pairs = [(s["recorded_rules"], s["new_rules"]) for s in data["steps"]]
        assert all(recorded == new for recorded, new in pairs)
        assert ["review-round-2"] in [new for _, new in pairs]

    def test_the_recorded_approval_answer_is_reused(
        self, recorded_campaign: Any, capsys: pytest.CaptureFixture
    ) -> None:
        data = replay_json(
            recorded_campaign, recorded_campaign.folder / "approval-policy.toml", capsys
        )
        (asked,) = [s for s in data["steps"] if s["new"] == "suspend"]
        assert asked["round_index"] == 2
        assert asked["note"] == "would have asked for approval; recorded answer: approved"

    def test_the_text_output_says_there_is_no_difference(
        self, recorded_campaign: Any, capsys: pytest.CaptureFixture
    ) -> None:
        code, out, _ = run_replay(
            recorded_campaign, recorded_campaign.folder / "approval-policy.toml", capsys
        )
        assert code == 0
        assert "No differences" in out


class TestStricterPolicy:
    def test_a_hard_stop_from_round_2_stops_there_and_later_rounds_are_not_reached(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        data = replay_json(
            recorded_campaign, write_policy(tmp_path, HARD_STOP_FROM_ROUND_2), capsys
        )
        assert new_by_round(data) == {0: "continue", 1: "continue", 2: "block", 3: NOT_REACHED}
        assert data["differences"]["stopped"] == [2]
        assert data["differences"]["not_reached"] == [3]
        assert (data["new_status"], data["new_error_code"], data["stopped_round"]) == (
            "blocked",
            "policy_denied",
            2,
        )

    def test_the_text_output_marks_not_reached_rounds(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        code, out, _ = run_replay(
            recorded_campaign, write_policy(tmp_path, HARD_STOP_FROM_ROUND_2), capsys
        )
        assert code == 0
        assert "would have stopped: round 2" in out
        assert "not reached (an earlier round stopped the campaign): round 3" in out
        assert "with the new policy: blocked (policy_denied) in round 2" in out

    def test_budget_counters_carry_forward_from_round_to_round(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        # 8 candidates x 0.01 node-hours per round: 0.16 spent once rounds 0 and 1 ran.
        policy = write_policy(
            tmp_path,
            '[[rules]]\nname = "spent"\nseverity = "HARD_STOP"\nwhen = "budget.spent > 0.15"\n',
        )
        data = replay_json(recorded_campaign, policy, capsys)
        assert new_by_round(data) == {0: "continue", 1: "continue", 2: "block", 3: NOT_REACHED}

    def test_earlier_decisions_are_the_new_policys_own(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        # The record suspended in round 2; the new policy never does, so round 3 sees none.
        policy = write_policy(
            tmp_path,
            '[[rules]]\nname = "after-suspend"\nseverity = "HARD_STOP"\n'
            "when = \"'suspend' in history.decisions\"\n",
        )
        data = replay_json(recorded_campaign, policy, capsys)
        assert "block" not in {s["new"] for s in data["steps"]}
        assert data["new_status"] == "completed"

    def test_a_refusal_with_no_recorded_answer_is_flagged_as_diverging(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        policy = write_policy(
            tmp_path,
            '[[rules]]\nname = "no-round-2"\nseverity = "PERSISTENT_BLOCK"\n'
            'when = "round.index == 2"\n',
        )
        data = replay_json(recorded_campaign, policy, capsys)
        (step,) = [s for s in data["steps"] if s["round_index"] == 2]
        assert step["new"] == "retry"
        assert "no recorded answer" in step["note"]
        assert data["diverged_from"] == 2

    def test_a_refusal_the_record_answered_is_judged_on_the_recorded_answer(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        policy = write_policy(
            tmp_path,
            '[[rules]]\nname = "no-round-3"\nseverity = "PERSISTENT_BLOCK"\n'
            'when = "round.index == 3"\n',
        )
        data = replay_json(recorded_campaign, policy, capsys)
        steps = [(s["call_index"], s["new"]) for s in data["steps"] if s["round_index"] == 3]
        assert steps == [(1, "retry"), (2, "retry")]
        assert (data["new_status"], data["new_error_code"]) == ("blocked", "policy_denied")
        assert data["diverged_from"] is None


class TestLenientPolicy:
    def test_no_retry_runs_the_first_batch_and_the_recorded_re_ask_is_not_called(
        self, recorded_campaign: Any, capsys: pytest.CaptureFixture
    ) -> None:
        # The demo's own approval policy: the recorded one minus the "second-look" rule.
        data = replay_json(recorded_campaign, DEMO_APPROVAL_POLICY, capsys)
        steps = [(s["call_index"], s["new"]) for s in data["steps"] if s["round_index"] == 3]
        assert steps == [(1, "continue"), (2, "not called")]
        assert data["diverged_from"] == 3
        assert data["new_status"] == "completed"
        assert data["differences"]["continued"] == [3]


class TestAskPolicy:
    def test_an_ask_in_round_1_would_have_asked_and_is_assumed_approved(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        code, out, _ = run_replay(recorded_campaign, write_policy(tmp_path, ASK_IN_ROUND_1), capsys)
        assert code == 0
        assert "would have asked for approval: round 1" in out
        assert "assumed approved" in out
        assert "with the new policy: completed" in out

    def test_a_run_that_cannot_suspend_escalates_instead(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        data = replay_json(
            recorded_campaign, write_policy(tmp_path, ASK_IN_ROUND_1), capsys, "--cannot-suspend"
        )
        assert new_by_round(data)[1] == "escalate"
        assert data["new_status"] == "escalated"
        assert data["differences"]["not_reached"] == [2, 3]


class TestNodeHours:
    def test_derived_from_the_recorded_budget_counters(self, recorded_campaign: Any) -> None:
        with ProvenanceStore.open(recorded_campaign.database, read_only=True) as store:
            assert derive_node_hours(read_record(store, recorded_campaign.name)) == 0.01

    def test_an_explicit_value_is_used_and_said(
        self, recorded_campaign: Any, tmp_path: Path
    ) -> None:
        policy = load_policy(write_policy(tmp_path, '[policy]\nname = "no-rules"\n'))
        with ProvenanceStore.open(recorded_campaign.database, read_only=True) as store:
            # Of the 64 node-hours budget round 0 spends 48; round 1's 48 no longer fit.
            result = replay(store, recorded_campaign.name, policy, node_hours_per_simulation=6.0)
        assert (result.node_hours_source, result.node_hours_per_simulation) == ("given", 6.0)
        assert (result.new_status, result.new_error_code, result.stopped_round) == (
            "blocked",
            "budget_exceeded",
            1,
        )


class TestReplayBadInput:
    def test_a_bad_rule_exits_2_naming_the_file_rule_and_field(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        policy = write_policy(
            tmp_path, '[[rules]]\nname = "typo"\nseverity = "HARD_STOP"\nwhen = "round.indx > 1"\n'
        )
        code, out, err = run_replay(recorded_campaign, policy, capsys)
        assert code == 2
        assert out == ""
        assert str(policy) in err
        assert "typo" in err
        assert "when" in err

    def test_a_missing_policy_file_exits_2(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        code, _, err = run_replay(recorded_campaign, tmp_path / "absent.toml", capsys)
        assert code == 2
        assert "absent.toml" in err

    def test_an_unknown_campaign_exits_2(
        self, recorded_campaign: Any, capsys: pytest.CaptureFixture
    ) -> None:
        policy = recorded_campaign.folder / "approval-policy.toml"
        argv = ["replay", "nope", "--policy", str(policy), "--db", str(recorded_campaign.database)]
        assert main(argv) == 2
        assert "no campaign named 'nope'" in capsys.readouterr().err

    def test_a_negative_node_hours_figure_exits_2(
        self, recorded_campaign: Any, capsys: pytest.CaptureFixture
    ) -> None:
        policy = recorded_campaign.folder / "approval-policy.toml"
        code, _, err = run_replay(
            recorded_campaign, policy, capsys, "--node-hours-per-simulation", "-1"
        )
        assert code == 2
        assert "--node-hours-per-simulation" in err


class TestNodeHoursFallback:
    @pytest.fixture
    def unstarted(self, tmp_path: Path) -> Path:
        """Return a campaign directory whose campaign is recorded but ran no round."""
        spec = {
            "name": "unstarted",
            "rounds": 2,
            "batch_size": 2,
            "budget_node_hours": 1.0,
            "objective": {"lower": [0.0], "upper": [1.0]},
            "planner": {"kind": "surrogate"},
        }
        with ProvenanceStore.open(tmp_path / "db") as store:
            store.ensure_campaign("unstarted", spec=spec, site="gone", seed=1, code_version="t")
        return tmp_path / "db"

    def test_the_site_config_is_asked_when_the_record_does_not_tell(
        self, unstarted: Path, tmp_path: Path
    ) -> None:
        asked: list[str] = []

        def site_cost(site: str) -> float:
            asked.append(site)
            return 0.5

        policy = load_policy(write_policy(tmp_path, '[policy]\nname = "no-rules"\n'))
        with ProvenanceStore.open(unstarted, read_only=True) as store:
            result = replay(store, "unstarted", policy, site_node_hours=site_cost)
        assert asked == ["gone"]
        assert (result.node_hours_per_simulation, result.node_hours_source) == (
            0.5,
            "site config 'gone'",
        )

    def test_no_known_cost_exits_2_asking_for_the_option(
        self, unstarted: Path, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        policy = write_policy(tmp_path, '[policy]\nname = "no-rules"\n')
        argv = ["replay", "unstarted", "--policy", str(policy), "--db", str(unstarted)]
        assert main(argv) == 2
        assert "--node-hours-per-simulation" in capsys.readouterr().err
