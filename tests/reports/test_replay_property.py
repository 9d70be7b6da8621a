"""Replay judges a recorded campaign exactly as the live run judged it.

A property over the demo campaigns of ``examples/demo`` recorded by the engine itself
under a set of policies (round rules, an approval, candidate rules with and without
top-ups, a rule on the last batch's failures): replaying each with the policy it ran
under reports no difference, call by call, candidate by candidate. Replaying one with
a policy that refuses some of its recorded candidates names each of them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flows._provenance import ProvenanceStore
from flows._replay import replay
from policies import load_policy

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"
FAULTY = Path(__file__).resolve().parents[1] / "reliability" / "faults" / "faulty_simulation.py"

FAR_CORNER = """\
[policy]
name = "far-corner"
{top_up}

[[rules]]
name = "far-corner"
description = "The far corner breaks the mesher."
severity = "HARD_STOP"
scope = "candidate"
when = "candidate.x[0] > 0.8 || (candidate.has_prediction && candidate.prediction > 20.0)"

[[rules]]
name = "budget"
severity = "PERSISTENT_BLOCK"
when = "batch.node_hours > budget.remaining"
"""

# Asks for a look at any round after a batch with a failed task (the record has one).
AFTER_FAILURES = """\
[policy]
name = "after-failures"

[[rules]]
name = "look-at-failures"
description = "A task of the last batch failed."
severity = "ASK"
when = "history.failed_last_batch >= 1"
approvers = ["alice"]
"""

# Refuses candidates by their coordinates only: which ones is known from the record alone.
LEFT_EDGE = """\
[policy]
name = "left-edge"

[[rules]]
name = "left-edge"
severity = "HARD_STOP"
scope = "candidate"
when = "candidate.x[0] < 0.3"
"""


@dataclass(frozen=True)
class Recorded:
    """A demo campaign the engine ran, and the policy file it ran under."""

    name: str
    database: Path
    policy: Path


def _approvals() -> Any:
    from flows._prefect._approval_form import Approval

    return iter([Approval(decision="approve", approver="alice", comment="seen")] * 8)


def _record(
    root: Path, engine_runner: Any, label: str, spec_file: str, policy_text: str | None, **edit: str
) -> Recorded:
    folder = root / label
    folder.mkdir()
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    spec = folder / spec_file
    text = spec.read_text()
    policy = folder / "approval-policy.toml" if "approval" in spec_file else folder / "policy.toml"
    if policy_text is not None:
        policy.write_text(policy_text)
    for old, new in edit.items():
        assert old in text, old
        text = text.replace(old, new)
    spec.write_text(text)
    name = next(line for line in text.splitlines() if line.startswith("name = "))
    name = name.split('"')[1]
    database = folder / "state" / "campaigns" / name
    result = asyncio.run(engine_runner(spec, database, _approvals()))
    assert result.status in ("completed", "blocked"), result
    return Recorded(name, database, policy)


@pytest.fixture(scope="module")
def recorded(engine_runner: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Recorded]:
    """Record the demo campaigns once, each under its own policy."""
    root = tmp_path_factory.mktemp("property")
    plan = root / "plan.json"
    plan.write_text(json.dumps({"0:1": "exit", "1:3": "exit"}))
    faulty = json.dumps([sys.executable, str(FAULTY), str(plan), "{round}", "{index}"])
    return {
        "demo": _record(root, engine_runner, "demo", "campaign.toml", None),
        "approval": _record(root, engine_runner, "approval", "campaign-approval.toml", None),
        "far-corner": _record(
            root, engine_runner, "far", "campaign.toml", FAR_CORNER.format(top_up="")
        ),
        "far-corner-top-up": _record(
            root,
            engine_runner,
            "topup",
            "campaign.toml",
            FAR_CORNER.format(top_up="top_up_from_fallback = true"),
        ),
        "failures": _record(
            root,
            engine_runner,
            "failures",
            "campaign.toml",
            AFTER_FAILURES,
            **{'simulation = "demo"': f"simulation = {faulty}"},
        ),
    }


def _replayed(campaign: Recorded, policy_text_or_file: Path | str, tmp_path: Path) -> Any:
    if isinstance(policy_text_or_file, str):
        path = tmp_path / "replayed-policy.toml"
        path.write_text(policy_text_or_file)
    else:
        path = policy_text_or_file
    with ProvenanceStore.open(campaign.database, read_only=True) as store:
        return replay(store, campaign.name, load_policy(path))


def _rows(campaign: Recorded, sql: str) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(f"file:{campaign.database / 'provenance.db'}?mode=ro", uri=True)
    try:
        return [tuple(row) for row in connection.execute(sql).fetchall()]
    finally:
        connection.close()


CASES = ["demo", "approval", "far-corner", "far-corner-top-up", "failures"]


class TestTheSamePolicyChangesNothing:
    @pytest.mark.parametrize("case", CASES)
    def test_every_call_and_every_candidate_is_judged_as_recorded(
        self, recorded: dict[str, Recorded], case: str, tmp_path: Path
    ) -> None:
        campaign = recorded[case]
        result = _replayed(campaign, campaign.policy, tmp_path)
        differing = [step for step in result.steps if step.differs]
        assert differing == []
        assert not any(result.differences().values()), result.differences()
        recorded_status = _rows(campaign, "SELECT status, error_code FROM campaign")[0]
        assert (result.new_status, result.new_error_code) == recorded_status

    def test_the_candidate_rule_cases_did_refuse_candidates_live(
        self, recorded: dict[str, Recorded]
    ) -> None:
        """The property is not vacuous: the live runs refused and topped up."""
        for case in ("far-corner", "far-corner-top-up"):
            refused = _rows(
                recorded[case], "SELECT count(*) FROM candidate_fate WHERE fate = 'refused'"
            )
            assert refused[0][0] > 0, case
        topped = _rows(
            recorded["far-corner-top-up"],
            "SELECT count(*) FROM candidate_fate WHERE source = 'fallback' AND fate = 'launched'",
        )
        assert topped[0][0] > 0
        failed = _rows(recorded["failures"], "SELECT count(*) FROM approval")
        assert failed[0][0] > 0  # the rule on the last batch's failures asked live

    def test_replay_names_the_recorded_refusals_of_each_call(
        self, recorded: dict[str, Recorded], tmp_path: Path
    ) -> None:
        campaign = recorded["far-corner"]
        result = _replayed(campaign, campaign.policy, tmp_path)
        fates = _rows(
            campaign,
            "SELECT round_index, call_index, source, candidate_index, rule FROM candidate_fate "
            "WHERE fate = 'refused'",
        )
        expected: dict[tuple[int, int], set[str]] = {}
        for round_index, call_index, source, index, rule in fates:
            expected.setdefault((round_index, call_index), set()).add(f"{source} {index} ({rule})")
        named = {
            (s.round_index, s.call_index): set(s.new_refused) for s in result.steps if s.new_refused
        }
        assert named == expected


class TestARefusingPolicyNamesEachRefusedCandidate:
    def test_each_recorded_candidate_the_new_rule_refuses_is_reported(
        self, recorded: dict[str, Recorded], tmp_path: Path
    ) -> None:
        campaign = recorded["demo"]
        result = _replayed(campaign, LEFT_EDGE, tmp_path)
        # What the rule refuses, from the record alone: each judged batch's left-edge points.
        calls = _rows(
            campaign,
            "SELECT g.round_index, g.call_index, g.disposition, g.fallback_value, a.value "
            "FROM gate_call g LEFT JOIN attempt a ON a.gate_call_id = g.id "
            "AND a.rejected_by IS NULL AND a.failed_by IS NULL",
        )
        expected: dict[tuple[int, int], set[str]] = {}
        for round_index, call_index, disposition, fallback, value in calls:
            batch = json.loads(value)["candidates"] if disposition == "accepted" else None
            batch = batch if batch is not None else json.loads(fallback)
            refused = {f"proposal {i} (left-edge)" for i, x in enumerate(batch) if x[0] < 0.3}
            if refused:
                expected[(round_index, call_index)] = refused
        assert expected, "the demo record has no candidate left of x = 0.3"
        judged = {
            (s.round_index, s.call_index): s for s in result.steps if s.call_index is not None
        }
        assert any(result.differences().values()), "the replay says no differences"
        for where, refused in expected.items():
            step = judged[where]
            if step.new in ("not reached", "not called"):
                continue
            assert step.differs, where
            assert "refuses proposal" in step.note, step.note
            assert set(step.new_refused) == refused, where
            assert step.recorded_refused == ()
        reported = {where for where, step in judged.items() if step.new_refused and step.differs}
        assert reported <= set(expected)
        assert reported, "no refusal was reported"
