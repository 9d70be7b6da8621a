"""A command's error reaches the user as one ``error:`` line and the exit status it carries.

Handlers raise; ``flows._cli.main`` reports once (``flows._cli._exit.report_error``).
These run the real commands whose checks need no server, and the seam itself with the
errors only the server-backed commands raise (``approve``'s refusals: exit 6).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows._cli import main
from flows._cli._exit import (
    EXIT_ANSWER_REFUSED,
    EXIT_BAD_INPUT,
    CommandError,
    ProblemsFoundError,
    report_error,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a state directory with campaign 'c' (an empty database file: never opened)."""
    state = tmp_path / "state"
    (state / "campaigns" / "c").mkdir(parents=True)
    (state / "campaigns" / "c" / "provenance.db").touch()
    monkeypatch.setenv("UNATTENDED_HOME", str(state))
    return state


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestOptionChecks:
    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["inspect", "--round", "0"], "--round needs a CAMPAIGN"),
            (
                ["export", "c", "--format", "ro-crate", "--records", "attempts"],
                "--records applies to jsonl and csv, not --format ro-crate",
            ),
            (
                ["export", "c", "--format", "csv", "--records", "all"],
                "--format csv needs --records attempts or task_results",
            ),
            (
                ["replay", "c", "--policy", "p.toml", "--node-hours-per-simulation", "-1"],
                "--node-hours-per-simulation must be a number >= 0",
            ),
        ],
        ids=["inspect-round", "export-records", "export-csv-all", "replay-node-hours"],
    )
    def test_a_bad_combination_is_one_line_and_exit_2(
        self, home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
    ) -> None:
        assert _run(capsys, *argv) == (EXIT_BAD_INPUT, "", f"error: {message}\n")

    def test_removing_a_login_nobody_has_is_one_line_and_exit_2(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, err = _run(capsys, "approvers", "remove", "nobody")
        assert (code, out) == (EXIT_BAD_INPUT, "")
        assert err.startswith("error: approver 'nobody' has no login (")
        assert err.count("\n") == 1

    def test_an_export_onto_an_existing_crate_is_one_line_and_exit_2(
        self, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        from flows._provenance import ProvenanceStore

        db = home / "campaigns" / "c" / "provenance.db"
        db.unlink()
        with ProvenanceStore.open(home / "campaigns" / "c") as store:
            store.ensure_campaign("c", spec={}, site="local", seed=1, code_version="t")
        taken = tmp_path / "taken"
        taken.mkdir()
        (taken / "keep").write_text("x")
        code, out, err = _run(capsys, "export", "c", "--format", "ro-crate", "--out", str(taken))
        assert (code, out) == (EXIT_BAD_INPUT, "")
        assert err.startswith(f"error: --out {taken}: ")
        assert err.count("\n") == 1
        assert (taken / "keep").read_text() == "x"


class TestReportError:
    def test_a_command_error_exits_with_the_code_it_carries(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        refused = CommandError(
            "refused: no", exit_code=EXIT_ANSWER_REFUSED, code="approver_not_allowed"
        )
        assert report_error(refused) == EXIT_ANSWER_REFUSED
        assert capsys.readouterr().err == "error: refused: no\n"

    def test_problems_found_are_one_error_line_each_then_how_many(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert report_error(ProblemsFoundError(["a: x", "b: y"])) == EXIT_BAD_INPUT
        assert capsys.readouterr().err == "error: a: x\nerror: b: y\n2 problems found\n"
