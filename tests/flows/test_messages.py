"""Messages say what happened, in words a scientist uses (issue 44's list).

Each test pins the key part of one message's wording: a typo's nearest field, the
exact field of a bad bound, an unknown campaign, no server. The approval wait is in
``test_progress.py``/``test_follow.py``, the status header in ``test_status_name.py``,
the plurals of ``inspect`` in ``tests/provenance/test_cli.py``.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from flows._cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    return tmp_path / "campaign.toml"


def _check_errors(spec: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["check", str(spec)]) == 2
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


class TestASpecTypo:
    def test_one_error_with_the_nearest_known_field(
        self, spec: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec.write_text(spec.read_text().replace("batch_size = 8", "batchsize = 8"))
        (error,) = _check_errors(spec, capsys)
        assert error.endswith("field 'batchsize': not a known field; did you mean `batch_size`?")

    def test_in_a_table_too(self, spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
        spec.write_text(spec.read_text().replace("timeout_minutes = 60", "timeout_minute = 60"))
        (error,) = _check_errors(spec, capsys)
        assert "field 'approvals.timeout_minute': not a known field; did you mean " in error
        assert error.endswith("`timeout_minutes`?")

    def test_a_name_near_nothing_suggests_nothing(
        self, spec: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec.write_text("colour = 'blue'\n" + spec.read_text())
        (error,) = _check_errors(spec, capsys)
        assert "field 'colour'" in error
        assert "did you mean" not in error


class TestBadBounds:
    def test_an_upper_bound_below_its_lower_is_reported_on_objective_upper(
        self, spec: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec.write_text(spec.read_text().replace("upper = [1.0, 1.0]", "upper = [1.0, -1.0]"))
        (error,) = _check_errors(spec, capsys)
        assert error.endswith("field 'objective.upper': bound 1 (-1) must be above lower's (0)")

    def test_a_length_mismatch_is_reported_on_objective_upper(
        self, spec: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec.write_text(spec.read_text().replace("upper = [1.0, 1.0]", "upper = [1.0]"))
        (error,) = _check_errors(spec, capsys)
        assert "field 'objective.upper': has 1 bounds but lower has 2" in error


class TestUnknownCampaign:
    @pytest.mark.parametrize("command", ["report", "inspect", "export"])
    def test_says_no_campaign_named_it(
        self,
        command: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        argv = [command, "nope"] + (["--format", "jsonl"] if command == "export" else [])
        assert main(argv) == 2
        assert capsys.readouterr().err.startswith(f"error: no campaign named nope in {tmp_path} ")


def test_no_server_points_to_unattended_up(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
    monkeypatch.setenv("UNATTENDED_SERVER_PORT", str(port))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert main(["status"]) != 0
    err = capsys.readouterr().err
    assert f"no Prefect server is running for this state directory ({tmp_path})" in err
    assert "'unattended up' starts it and the runner" in err
    assert "server start" not in err
