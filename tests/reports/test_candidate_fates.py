"""Per-candidate oversight through the engine and the real store: who ran, and why not.

Each campaign is the approval demo cut to one round (real executables, the
verifier on the allocation, a real SQLite provenance database) with a policy
holding a candidate rule: ``far-corner`` refuses candidates 2 and 3 of round 0's
accepted batch (x >= 0.85). ``inspect --round 0 --json`` reads the fates back.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flows._cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"
NAME = "demo-approval"
FAR_CORNER = """
[[rules]]
name = "far-corner"
description = "The far corner breaks the mesher."
severity = "HARD_STOP"
scope = "candidate"
when = "candidate.x[0] > 0.85"
"""
ASK_ROUND_0 = """
[[rules]]
name = "review"
severity = "ASK"
when = "round.index == 0"
approvers = ["alice"]
"""


class Suspended(BaseException):
    """What leaving the process at a suspend looks like to the engine (not an Exception)."""


def _campaign(
    folder: Path, *, rules: str = FAR_CORNER, top_up: bool = False, ask: bool = False
) -> Path:
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    spec = folder / "campaign-approval.toml"
    spec.write_text(spec.read_text().replace("rounds = 4", "rounds = 1"))
    policy = f'[policy]\nname = "p"\ntop_up_from_fallback = {str(top_up).lower()}\n' + rules
    (folder / "approval-policy.toml").write_text(policy + (ASK_ROUND_0 if ask else ""))
    return spec


def _run(engine_runner: Any, spec: Path, answers: Iterator[Any]) -> Any:
    return asyncio.run(engine_runner(spec, spec.parent / "state", answers))


def _round(folder: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    argv = ["inspect", NAME, "--round", "0", "--json", "--db", str(folder / "state")]
    assert main(argv) == 0
    view: dict[str, Any] = json.loads(capsys.readouterr().out)
    return view


def _fates(view: dict[str, Any]) -> list[tuple[str, int, str, str | None]]:
    return [
        (c["source"], c["candidate_index"], c["fate"], c["rule"] or c["actor"])
        for c in view["candidates"]
    ]


def _answers(*items: Any) -> Iterator[Any]:
    yield from items


class TestCandidateRulesInTheEngine:
    def test_refused_candidates_are_not_launched_and_their_fate_says_why(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = _campaign(tmp_path)
        assert _run(engine_runner, spec, _answers()).status == "completed"
        view = _round(tmp_path, capsys)
        proposed = view["gate_calls"][0]["attempts"][-1]["value"]["candidates"]
        kept = [c for i, c in enumerate(proposed) if i not in (2, 3)]
        assert [b["candidates"] for b in view["batches"]] == [kept]
        assert _fates(view) == [
            (
                "proposal",
                i,
                "refused" if i in (2, 3) else "launched",
                "far-corner" if i in (2, 3) else None,
            )
            for i in range(8)
        ]
        refused = view["candidates"][2]
        assert refused["reason"].startswith("rule 'far-corner': `candidate.x[0] > 0.85` held")

    def test_every_candidate_carries_its_verifier_prediction_as_a_score(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = _campaign(tmp_path, rules="")
        assert _run(engine_runner, spec, _answers()).status == "completed"
        scores = _round(tmp_path, capsys)["gate_calls"][0]["attempts"][-1]["scores"]
        each = [scores[f"verifier_prediction.{i}"] for i in range(8)]
        assert max(each) == scores["verifier_prediction"]

    def test_a_thinned_batch_is_topped_up_from_the_fallback_when_the_policy_says_so(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = _campaign(tmp_path, top_up=True)
        assert _run(engine_runner, spec, _answers()).status == "completed"
        view = _round(tmp_path, capsys)
        launched = [c for c in view["candidates"] if c["fate"] == "launched"]
        assert len(view["batches"][0]["candidates"]) == 8
        assert [c["source"] for c in launched] == ["proposal"] * 6 + ["fallback"] * 2
        fallback = view["gate_calls"][0]["fallback_value"]
        assert view["batches"][0]["candidates"][6:] == [
            fallback[c["candidate_index"]] for c in launched[6:]
        ]

    def test_a_batch_whose_every_candidate_is_refused_is_blocked(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = _campaign(tmp_path, rules=FAR_CORNER.replace("candidate.x[0] > 0.85", "true"))
        result = _run(engine_runner, spec, _answers())
        assert (result.status, result.error_code) == ("blocked", "policy_denied")
        view = _round(tmp_path, capsys)
        assert view["batches"] == []
        assert {c["fate"] for c in view["candidates"]} == {"refused"}
        # No decision was taken on the call, and its end is recorded all the same.
        assert view["decisions"] == []
        assert [(g["disposition"], g["attempts_used"]) for g in view["gate_calls"]] == [
            ("accepted", 2)
        ]


class TestCandidatesAndApprovals:
    def test_an_approver_who_keeps_the_first_n_strikes_the_rest(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        from flows._prefect._approval_form import Approval

        spec = _campaign(tmp_path, ask=True)
        answer = Approval(decision="approve", approver="alice", batch_size=3)
        assert _run(engine_runner, spec, _answers(answer)).status == "completed"
        fates = _fates(_round(tmp_path, capsys))
        assert [f for f in fates if f[2] == "launched"] == [
            ("proposal", i, "launched", None) for i in (0, 1, 4)
        ]
        assert [f for f in fates if f[2] == "struck"] == [
            ("proposal", i, "struck", "alice") for i in (5, 6, 7)
        ]

    def test_the_report_counts_what_the_form_asked_about_and_the_first_n_kept(
        self, tmp_path: Path, engine_runner: Any, report_writer: Any
    ) -> None:
        from flows._prefect._approval_form import Approval

        spec = _campaign(tmp_path, ask=True)
        answer = Approval(decision="approve", approver="alice", batch_size=3)
        assert _run(engine_runner, spec, _answers(answer)).status == "completed"
        campaign = SimpleNamespace(name=NAME, database=tmp_path / "state")
        html = report_writer(campaign, tmp_path / "report").path.read_text()
        # far-corner refused 2 of the 8 before asking: the form listed 6, alice kept #0-#2.
        assert re.search(
            r"<td>3 of 6 candidates \(#0, #1, #2\) approved by alice at "
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>",
            html,
        )

    def test_a_rejected_batch_skips_its_candidates_and_a_replay_records_nothing_twice(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        from flows._prefect._approval_form import Approval

        def leave_at_suspend() -> Iterator[Any]:
            raise Suspended
            yield  # a generator whose first answer is leaving the process

        spec = _campaign(tmp_path, ask=True)
        with pytest.raises(Suspended):
            _run(engine_runner, spec, leave_at_suspend())
        first = _fates(_round(tmp_path, capsys))
        assert [f[2] for f in first] == ["refused", "refused"]  # the rest is still undecided
        reject = Approval(decision="reject", approver="alice")
        result = _run(engine_runner, spec, _answers(reject))  # replayed from the top
        assert (result.status, result.error_code) == ("blocked", "approval_rejected")
        view = _round(tmp_path, capsys)
        assert _fates(view) == [
            (
                "proposal",
                i,
                "refused" if i in (2, 3) else "skipped",
                "far-corner" if i in (2, 3) else None,
            )
            for i in range(8)
        ]
        assert view["candidates"][0]["reason"] == "the approval ended: approval_rejected"

    def test_inspect_shows_the_candidates_table(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = _campaign(tmp_path)
        assert _run(engine_runner, spec, _answers()).status == "completed"
        capsys.readouterr()
        assert main(["inspect", NAME, "--round", "0", "--db", str(tmp_path / "state")]) == 0
        out = capsys.readouterr().out
        assert "Candidates" in out
        assert "rule far-corner" in out
        assert "refused" in out
        assert "launched" in out

    def test_a_subset_is_numbered_like_the_form_s_table_after_the_rules_thinned_it(
        self, tmp_path: Path, engine_runner: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        from flows._prefect._approval_form import Approval

        # far-corner refuses proposal 2 and 3: the form's table lists proposal 0, 1, 4,
        # 5, 6, 7 as # 0 to 5, so # 2 and 3 are proposal 4 and 5.
        spec = _campaign(tmp_path, ask=True)
        answer = Approval(decision="approve", approver="alice", candidates=[2, 3])
        assert _run(engine_runner, spec, _answers(answer)).status == "completed"
        view = _round(tmp_path, capsys)
        proposed = view["gate_calls"][0]["attempts"][-1]["value"]["candidates"]
        assert [b["candidates"] for b in view["batches"]] == [[proposed[4], proposed[5]]]
        fates = _fates(view)
        assert [f for f in fates if f[2] == "launched"] == [
            ("proposal", i, "launched", None) for i in (4, 5)
        ]
        assert [f[1] for f in fates if f[2] == "struck"] == [0, 1, 6, 7]
