"""After a rejection, ``inspect`` and ``report`` show the round as it ended, not ``running``.

The approval demo runs with the engine itself (real executables, real SQLite
provenance); the approval hook answers like a human would: bob rejects round 2.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from flows._cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


@pytest.fixture(scope="module")
def rejected(tmp_path_factory: pytest.TempPathFactory, engine_runner: Any) -> Path:
    from flows._prefect._approval_form import Approval

    folder = tmp_path_factory.mktemp("rejected")
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    database = folder / "state" / "campaigns" / "demo-approval"
    answers = iter([Approval(decision="reject", approver="bob", comment="too close to round 1")])
    result = asyncio.run(engine_runner(folder / "campaign-approval.toml", database, answers))
    assert (result.status, result.error_code) == ("blocked", "approval_rejected")
    return database


class TestARejectedRound:
    def test_inspect_shows_it_blocked_with_the_verdict(
        self, rejected: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["inspect", "demo-approval", "--json", "--db", str(rejected)]) == 0
        rounds = json.loads(capsys.readouterr().out)["rounds"]
        last = rounds[-1]
        assert (last["index"], last["status"], last["decision"]) == (
            2,
            "blocked",
            "suspend: rejected",
        )
        assert last["finished_at"] is not None

    def test_the_report_shows_it_blocked_with_the_verdict(
        self, rejected: Path, tmp_path: Path
    ) -> None:
        output = tmp_path / "report"
        argv = ["report", "demo-approval", "--db", str(rejected), "--output", str(output)]
        assert main(argv) == 0
        html = next(output.glob("*.html")).read_text()
        assert "<td>blocked</td><td>suspend: rejected</td>" in html
        assert "running" not in html

    def test_the_report_says_who_rejected_when_and_what_did_not_run(
        self, rejected: Path, tmp_path: Path
    ) -> None:
        output = tmp_path / "report"
        argv = ["report", "demo-approval", "--db", str(rejected), "--output", str(output)]
        assert main(argv) == 0
        html = (output / "report.html").read_text()
        when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
        line = (
            rf"<td>2</td><td>review-round-2</td><td>{when}</td>"
            rf"<td>rejected by bob at {when}: 8 candidates not run</td>"
            r"<td>too close to round 1</td>"
        )
        assert re.search(line, html), html[html.index('id="approvals"') :][:800]
