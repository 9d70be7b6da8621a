"""``unattended inspect`` and ``export`` against real databases, good and broken."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from flows._cli import main
from flows._provenance import ProvenanceStore


@pytest.fixture
def state(tmp_path: Path, record_campaign: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a state directory holding campaign 'demo' where the flow puts it."""
    home = tmp_path / "state"
    with ProvenanceStore.open(home / "campaigns" / "demo") as store:
        record_campaign(store, "demo", rounds=2)
    monkeypatch.setenv("UNATTENDED_HOME", str(home))
    return home


def _files(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestInspect:
    def test_without_a_campaign_it_lists_campaigns(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "inspect", "--json")
        assert code == 0
        assert [(c["name"], c["rounds"]) for c in json.loads(out)] == [("demo", 2)]

    def test_a_summary_shows_acceptance_and_the_best_result(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "inspect", "demo")
        assert code == 0
        assert "acceptance rate 100.0% of gate calls" in out
        assert "Best result: 0.5 in round 1" in out

    def test_the_summary_counts_in_words_one_round_one_fallback(
        self, tmp_path: Path, record_campaign: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with ProvenanceStore.open(tmp_path / "one") as store:
            record_campaign(store, "one", rounds=1)
            call = store.record_gate_call(
                "one", 0, 1, gate="planner", budget=3, fallback_hash="h", fallback_value=[[0.5]]
            )
            store.finish_gate_call(call, "fallback", 0)
        code, out, _ = _run(capsys, "inspect", "one", "--db", str(tmp_path / "one"))
        assert code == 0
        assert "1 round, 2 gate calls, 2 attempts; " in out
        assert "; 1 fallback; " in out

    def test_the_json_summary_has_the_totals(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "inspect", "demo", "--json")
        assert (code, json.loads(out)["totals"]["attempts"]) == (0, 4)

    def test_a_round_shows_what_was_rejected_and_why(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "inspect", "demo", "--round", "1")
        assert code == 0
        for expected in (
            "rejected by bounds",
            "x[0] above 1.0",
            "fallback sha h1",
            "suspend",
            "mallory",
            "approved by alice",
            "boom",
        ):
            assert expected in out

    def test_a_round_as_json_carries_every_verdict(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, out, _ = _run(capsys, "inspect", "demo", "--round", "0", "--json")
        attempt = json.loads(out)["gate_calls"][0]["attempts"][0]
        assert [v["check"] for v in attempt["verdicts"]] == ["schema", "bounds"]

    def test_db_accepts_a_campaign_directory(
        self, state: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("UNATTENDED_HOME")
        code, out, _ = _run(
            capsys, "inspect", "demo", "--json", "--db", str(state / "campaigns" / "demo")
        )
        assert (code, json.loads(out)["campaign"]["name"]) == (0, "demo")

    def test_db_accepts_a_postgresql_or_sqlite_url(
        self, store: Any, db_url: str, record_campaign: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        record_campaign(store, "demo", rounds=1)
        code, out, _ = _run(capsys, "inspect", "demo", "--json", "--db", db_url)
        assert (code, json.loads(out)["totals"]["rounds"]) == (0, 1)

    def test_recorded_text_is_printed_literally_not_as_markup(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with ProvenanceStore.open(tmp_path) as store:
            store.ensure_campaign("m", spec={}, site="s", seed=1, code_version="v")
            call = store.record_gate_call(
                "m", 0, 0, gate="g", budget=1, fallback_hash=None, fallback_value=None
            )
            store.record_attempt(call, {"number": 1, "value": "[red]x[/red]", "duration": 0.0})
        _, out, _ = _run(capsys, "inspect", "m", "--round", "0", "--db", str(tmp_path))
        assert "[red]x[/red]" in out


class TestWidth:
    """``inspect`` fits a 100-column terminal; ``--wide`` and ``--json`` keep everything."""

    @pytest.mark.parametrize(
        "argv",
        [[], ["demo"], ["demo", "--round", "0"], ["demo", "--round", "1"]],
        ids=["list", "summary", "round0", "round1"],
    )
    def test_no_line_is_wider_than_100_columns(
        self, argv: list[str], state: Path, widest_inspect_line: Any
    ) -> None:
        assert widest_inspect_line(*argv) <= 100

    def test_cells_are_summaries_and_wide_shows_the_values(
        self, state: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("COLUMNS", "100")
        _, narrow, _ = _run(capsys, "inspect", "demo", "--round", "0")
        monkeypatch.delenv("COLUMNS")
        _, wide, _ = _run(capsys, "inspect", "demo", "--round", "0", "--wide")
        assert '{"x":[9.0]}' not in narrow  # an attempt's value is summarised
        assert "x [9]" in narrow
        assert "bounds failed; 1 passed" in narrow
        assert '{"x":[9.0]}' in wide
        assert "bounds: FAIL x[0] above 1.0" in wide

    def test_the_summary_names_the_round_s_best_and_the_best_so_far(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, out, _ = _run(capsys, "inspect", "demo")
        assert "round's best" in out
        assert "best so far" in out


class TestBadInput:
    def _refused(self, capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> str:
        before = _files(root)
        code, out, err = _run(capsys, *argv)
        assert (code, out) == (2, "")
        assert _files(root) == before
        return err

    def test_a_missing_database_creates_nothing(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        err = self._refused(capsys, tmp_path, "inspect", "demo", "--db", str(tmp_path / "nope"))
        assert "no provenance database" in err

    def test_an_empty_state_directory_is_reported(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        assert "no provenance database" in self._refused(capsys, tmp_path, "inspect")

    def test_a_garbage_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        (tmp_path / "p.db").write_bytes(os.urandom(4096))
        err = self._refused(capsys, tmp_path, "inspect", "--db", str(tmp_path / "p.db"))
        assert "not a SQLite database" in err

    def test_an_empty_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        (tmp_path / "p.db").touch()
        err = self._refused(capsys, tmp_path, "inspect", "x", "--db", str(tmp_path / "p.db"))
        assert "is empty" in err

    def test_a_truncated_database(self, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = state / "campaigns" / "demo" / "provenance.db"
        path.write_bytes(path.read_bytes()[:5000])
        err = self._refused(capsys, state, "inspect", "demo", "--round", "1")
        assert "error:" in err

    def test_a_newer_schema(self, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
        with ProvenanceStore.open(state / "campaigns" / "demo") as store, store.engine.begin() as c:
            c.execute(text("UPDATE alembic_version SET version_num = '0999'"))
        err = self._refused(capsys, state, "inspect", "demo")
        assert "'0999'" in err

    def test_an_unknown_campaign(self, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
        db = str(state / "campaigns" / "demo")
        err = self._refused(capsys, state, "inspect", "ghost", "--db", db)
        assert "no campaign named 'ghost'" in err

    def test_an_unknown_round(self, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
        err = self._refused(capsys, state, "inspect", "demo", "--round", "9")
        assert "no round 9" in err

    def test_export_of_an_unknown_campaign_writes_no_file(
        self, state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        db = str(state / "campaigns" / "demo")
        self._refused(
            capsys,
            tmp_path,
            "export",
            "ghost",
            "--format",
            "jsonl",
            "--db",
            db,
            "--output",
            str(tmp_path / "out.jsonl"),
        )
        assert not (tmp_path / "out.jsonl").exists()

    def test_csv_of_every_record_kind_is_refused(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        err = self._refused(capsys, state, "export", "demo", "--format", "csv", "--records", "all")
        assert "--records" in err


class TestExport:
    def test_jsonl_holds_every_kind_of_record(
        self, state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        out_file = tmp_path / "out.jsonl"
        assert (
            _run(capsys, "export", "demo", "--format", "jsonl", "--output", str(out_file))[0] == 0
        )
        kinds = [json.loads(line)["kind"] for line in out_file.read_text().splitlines()]
        assert {k: kinds.count(k) for k in set(kinds)} == {
            "campaign": 1,
            "round": 2,
            "decision": 2,
            "attempt": 4,
            "approval": 1,
            "batch": 2,
            "task_result": 4,
        }

    def test_csv_has_one_row_per_attempt(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "export", "demo", "--format", "csv")
        rows = list(csv.DictReader(io.StringIO(out)))
        assert code == 0
        assert [(r["round_index"], r["number"], r["accepted"]) for r in rows] == [
            ("0", "1", "False"),
            ("0", "2", "True"),
            ("1", "1", "False"),
            ("1", "2", "True"),
        ]
        assert json.loads(rows[0]["verdicts"])[1]["reason"] == "x[0] above 1.0"

    def test_csv_of_task_results(self, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
        _, out, _ = _run(capsys, "export", "demo", "--format", "csv", "--records", "task_results")
        rows = list(csv.DictReader(io.StringIO(out)))
        assert [(r["batch"], r["status"]) for r in rows] == [
            ("demo-r0-batch", "done"),
            ("demo-r0-batch", "failed"),
            ("demo-r1-batch", "done"),
            ("demo-r1-batch", "failed"),
        ]


class TestHelp:
    def test_inspect_help_does_not_load_prefect_or_the_store(self) -> None:
        """Report how long ``unattended inspect --help`` takes in a clean interpreter."""
        code = (
            "import sys, time\n"
            "start = time.perf_counter()\n"
            "from flows._cli import main\n"
            "try:\n"
            "    main(['inspect', '--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('ELAPSED', time.perf_counter() - start)\n"
            "print('LOADED', sorted(m for m in ('prefect', 'sqlalchemy', 'sqlmodel', "
            "'opentelemetry.sdk') if m in sys.modules))\n"
        )
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**os.environ, "PYTHONWARNINGS": ""},
        )
        wall = time.perf_counter() - started
        lines = dict(
            line.split(" ", 1)
            for line in done.stdout.splitlines()
            if line.startswith(("ELAPSED", "LOADED"))
        )
        print(f"inspect --help: {float(lines['ELAPSED']):.3f} s in-process, {wall:.3f} s wall")
        assert "Without CAMPAIGN, list campaigns" in done.stdout
        assert lines["LOADED"] == "[]"


class TestImports:
    def test_the_store_and_the_cli_module_load_without_prefect_or_the_otel_sdk(self) -> None:
        code = (
            "import sys\n"
            "import flows._cli._inspect, flows._provenance, flows._cli._render\n"
            "print(sorted(m for m in ('prefect', 'opentelemetry.sdk') if m in sys.modules))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        assert done.stdout.strip() == "[]"

    def test_the_public_surface_is_pinned(self) -> None:
        import flows._provenance

        assert flows._provenance.__all__ == [
            "HEAD_REVISION",
            "ApprovalEventRecord",
            "ApprovalRow",
            "CampaignFenced",
            "CampaignStatus",
            "CandidateFateRecord",
            "Checkpoint",
            "DecisionMismatch",
            "EndingStatus",
            "GateCallEnd",
            "LeaseRow",
            "ProvenanceDatabaseError",
            "ProvenanceStore",
            "RunEnding",
            "SpecChanged",
            "StorageUnavailable",
            "TaskResultRecord",
        ]
