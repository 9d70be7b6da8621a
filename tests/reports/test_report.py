"""``unattended report``: an offline HTML report from a real recorded campaign."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flows._cli import main
from flows._provenance import ProvenanceStore
from flows._report import FIGURE_FILES, collect

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def report(recorded_report: Any) -> tuple[Path, str]:
    """The report written once through the CLI: its path and what the CLI printed."""
    return recorded_report.path, recorded_report.printed


@pytest.fixture(scope="module")
def collected(recorded_campaign: Any) -> dict:
    with ProvenanceStore.open(recorded_campaign.database, read_only=True) as store:
        return collect(store, recorded_campaign.name)


class TestReportFiles:
    def test_prints_the_path_of_the_html_file(self, report: tuple[Path, str]) -> None:
        path, printed = report
        assert printed.strip() == str(path)

    def test_writes_every_figure_as_a_png_beside_the_html(self, report: tuple[Path, str]) -> None:
        path, _ = report
        for name in FIGURE_FILES:
            assert (path.parent / name).read_bytes().startswith(b"\x89PNG"), name

    def test_embeds_the_same_figures_as_data_uris(self, report: tuple[Path, str]) -> None:
        path, _ = report
        document = path.read_text()
        embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', document)
        on_disk = {(path.parent / name).read_bytes() for name in FIGURE_FILES}
        assert {base64.b64decode(e) for e in embedded} == on_disk

    def test_has_every_section(self, report: tuple[Path, str]) -> None:
        document = report[0].read_text()
        for section in ("best", "acceptance", "rejections", "approvals", "simulation"):
            assert f'<h2 id="{section}">' in document

    def test_loads_nothing_from_the_network(self, report: tuple[Path, str]) -> None:
        document = report[0].read_text()
        assert "http://" not in document
        assert "https://" not in document


class TestReportEscaping:
    def test_a_planted_script_in_a_rationale_is_escaped(self, report: tuple[Path, str]) -> None:
        document = report[0].read_text()
        assert "<script" not in document.lower()
        assert "&lt;script&gt;alert(&#x27;planted&#x27;)&lt;/script&gt;" in document

    def test_the_planted_rationale_is_the_one_recorded(
        self, recorded_campaign: Any, collected: dict
    ) -> None:
        assert collected["rounds"][0]["rationale"] == recorded_campaign.planted


class TestVerifierPrediction:
    def test_every_accepted_attempt_records_the_verifier_prediction_as_a_score(
        self, recorded_campaign: Any
    ) -> None:
        with ProvenanceStore.open(recorded_campaign.database, read_only=True) as store:
            attempts = [
                attempt
                for index in range(4)
                for call in store.gate_calls(recorded_campaign.name, index)
                for attempt in store.attempts(call["id"])
                if attempt["rejected_by"] is None
            ]
        assert attempts
        for attempt in attempts:
            prediction = attempt["scores"]["verifier_prediction"]
            assert 0.0 <= prediction <= 25.0  # the demo's verifier_limit let it through

    def test_the_report_shows_the_prediction_of_each_accepted_round(
        self, collected: dict, report: tuple[Path, str]
    ) -> None:
        accepted = [r for r in collected["rounds"] if "accepted" in r["dispositions"]]
        assert accepted
        assert all(isinstance(r["verifier_prediction"], float) for r in accepted)
        html = report[0].read_text()
        assert "<th>verifier predicted</th>" in html
        assert f"<td>{accepted[0]['verifier_prediction']:.6g}</td>" in html


class TestReportData:
    def test_best_so_far_never_rises(self, collected: dict) -> None:
        best = [r["best_so_far"] for r in collected["rounds"]]
        assert all(b is not None for b in best)
        assert best == sorted(best, reverse=True)
        assert best[-1] == collected["best_result"]["objective"]

    def test_acceptance_rate_per_round_follows_the_dispositions(self, collected: dict) -> None:
        rates = {r["index"]: r["acceptance_rate"] for r in collected["rounds"]}
        fallback_rounds = [
            r["index"] for r in collected["rounds"] if "fallback" in r["dispositions"]
        ]
        assert fallback_rounds
        assert all(rates[i] == 0.0 for i in fallback_rounds)
        assert sum(r == 1.0 for r in rates.values()) == len(rates) - len(fallback_rounds)

    def test_rejection_reasons_are_counted_from_every_attempt(
        self, recorded_campaign: Any, collected: dict
    ) -> None:
        expected: dict[tuple[str, str], int] = {}
        with ProvenanceStore.open(recorded_campaign.database, read_only=True) as store:
            for r in collected["rounds"]:
                for call in store.round_view(recorded_campaign.name, r["index"])["gate_calls"]:
                    for attempt in call["attempts"]:
                        if attempt["rejected_by"]:
                            key = (attempt["rejected_by"], attempt["reason"])
                            expected[key] = expected.get(key, 0) + 1
        ranked = collected["rejections"]
        assert {(e["rejected_by"], e["reason"]): e["count"] for e in ranked} == expected
        assert [e["count"] for e in ranked] == sorted((e["count"] for e in ranked), reverse=True)

    def test_the_approval_shows_who_decided_and_the_wait(self, collected: dict) -> None:
        (approval,) = collected["approvals"]
        assert (approval["round_index"], approval["decided_by"], approval["decision"]) == (
            2,
            "alice",
            "approved",
        )
        assert approval["refused_answers"] == 1  # mallory, who may not approve
        assert approval["wait_seconds"] is not None
        assert approval["wait_seconds"] >= 0

    def test_every_batch_has_its_wall_time_and_task_runtimes(self, collected: dict) -> None:
        batches = collected["batches"]
        assert [b["round_index"] for b in batches] == [0, 1, 2, 3]
        for batch in batches:
            assert batch["wall_seconds"] is not None
            assert batch["wall_seconds"] >= 0
            assert batch["done"] == batch["candidates"] == len(batch["runtimes"])
            runtime = batch["runtime"]
            assert runtime["min"] <= runtime["median"] <= runtime["max"]


class TestReportBadInput:
    def test_an_unknown_campaign_exits_2_and_writes_nothing(
        self, recorded_campaign: Any, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        output = tmp_path / "out"
        db = str(recorded_campaign.database)
        code = main(["report", "no-such", "--db", db, "--output", str(output)])
        assert code == 2
        assert "no campaign named 'no-such'" in capsys.readouterr().err
        assert not output.exists()

    def test_a_missing_database_exits_2_and_writes_nothing(
        self, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        output = tmp_path / "out"
        db = str(tmp_path / "absent" / "provenance.db")
        code = main(["report", "demo", "--db", db, "--output", str(output)])
        assert code == 2
        err = capsys.readouterr().err
        assert err.startswith("error:")
        assert "absent" in err
        assert not output.exists()
        assert not (tmp_path / "absent").exists()


class TestRegistering:
    def test_the_cli_parser_imports_no_matplotlib_prefect_or_numpy(self) -> None:
        code = (
            "import sys, flows._cli as cli; cli.build_parser(); "
            "print(sorted(m for m in ('matplotlib', 'prefect', 'numpy') if m in sys.modules))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert done.stdout.strip() == "[]"
