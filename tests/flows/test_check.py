"""``unattended check``: everything submit checks, with no server, every problem listed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows._check import check_campaign
from flows._cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "demo"


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A copy of the demo campaign (spec, policies, transcript) in ``tmp_path``."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    return tmp_path


def edit(spec: Path, old: str, new: str) -> Path:
    text = spec.read_text()
    assert old in text, old
    spec.write_text(text.replace(old, new))
    return spec


class TestCheckCommand:
    @pytest.mark.parametrize("spec", ["campaign.toml", "campaign-approval.toml"])
    def test_the_demo_specs_pass_with_exit_0(
        self, spec: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["check", str(EXAMPLES / spec)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("ok: campaign demo")
        assert "policy rules;" in out or "policy rule;" in out

    def test_every_problem_is_listed_with_file_and_field_and_exit_2(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = edit(demo / "campaign.toml", "batch_size = 8", "batch_size = true")
        edit(spec, "verifier_limit = 25.0", "verifier_limit = nan")
        (demo / "transcript.jsonl").write_text("")

        assert main(["check", str(spec)]) == 2

        lines = capsys.readouterr().err.splitlines()
        assert lines[:3] == [
            f"error: {spec}: field 'batch_size': Input should be a valid integer",
            f"error: {spec}: field 'objective.verifier_limit': Input should be a finite number",
            f"error: {spec}: field 'planner.transcript': {demo / 'transcript.jsonl'}: "
            "the transcript has no answers",
        ]
        assert lines[3:] == ["3 problems found"]

    def test_a_simulation_that_is_not_executable_is_refused(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        program = demo / "sim.sh"
        program.write_text("#!/bin/sh\n")
        program.chmod(0o644)
        spec = edit(
            demo / "campaign.toml", 'simulation = "demo"', f'simulation = ["{program}", "--fast"]'
        )
        assert main(["check", str(spec)]) == 2
        err = capsys.readouterr().err
        assert f"field 'objective.simulation': {program}: is not executable" in err

    def test_a_program_not_on_path_is_refused(self, demo: Path) -> None:
        spec = edit(demo / "campaign.toml", 'simulation = "demo"', 'simulation = ["no-such-sim"]')
        report = check_campaign(spec, env={"PATH": str(demo)})
        assert [p.field for p in report.problems] == ["objective.simulation"]
        assert "'no-such-sim' not found on PATH" in report.problems[0].text

    def test_a_campaign_without_rules_must_opt_in(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = edit(demo / "campaign.toml", 'policy = "policy.toml"\n', "")
        assert main(["check", str(spec)]) == 2
        assert "field 'policy': no policy file is given" in capsys.readouterr().err

        edit(spec, 'name = "demo"', 'name = "demo"\nallow_no_rules = true')
        assert main(["check", str(spec)]) == 0
        assert "no policy rules (allowed)" in capsys.readouterr().out

    def test_a_campaign_whose_fallback_cannot_be_built_is_refused(self, demo: Path) -> None:
        """Eight distinct candidates do not fit between 0 and the smallest float."""
        spec = edit(demo / "campaign.toml", "lower = [0.0, 0.0]", "lower = [0.0]")
        edit(spec, "upper = [1.0, 1.0]", "upper = [5e-324]")
        report = check_campaign(spec, env={})
        assert [p.field for p in report.problems] == ["batch_size"]
        assert "no fallback batch of this size" in report.problems[0].text

    def test_the_site_option_names_itself_when_missing(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        site = demo / "nowhere.toml"
        assert main(["check", str(demo / "campaign.toml"), "--site", str(site)]) == 2
        assert capsys.readouterr().err.splitlines()[0] == f"error: --site: {site}: no such file"

    def test_a_site_path_in_the_spec_resolves_against_the_spec_folder(self, demo: Path) -> None:
        shutil.copy(ROOT / "site-configs" / "local.toml", demo / "my-site.toml")
        spec = edit(demo / "campaign.toml", 'site = "local"', 'site = "my-site.toml"')
        report = check_campaign(spec, env={})
        assert report.checked is not None, report.problems
        assert report.checked.site_location == str(demo / "my-site.toml")

    def test_check_imports_no_prefect(self) -> None:
        code = (
            "import sys; from flows._cli import main; "
            f"code = main(['check', {str(EXAMPLES / 'campaign.toml')!r}]); "
            "assert code == 0, code; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'prefect']"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stderr


ASK_RULE = """
[[rules]]
name = "review"
description = "A human reviews round 1."
severity = "ASK"
when = "round.index == 1"
"""


class TestCheckRefusesWhatCannotRun:
    def test_an_ask_rule_nobody_may_answer_is_refused_naming_the_rule(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        policy = demo / "policy.toml"
        policy.write_text(policy.read_text() + ASK_RULE)
        edit(demo / "campaign.toml", 'approvers = ["alice", "bob"]\n', "")

        assert main(["check", str(demo / "campaign.toml")]) == 2

        err = capsys.readouterr().err
        assert f"error: {policy}: field 'rules.review.approvers': rule 'review' asks" in err
        assert "names no approvers, so nobody may answer" in err

    def test_an_ask_rule_without_its_own_is_answered_by_the_campaign_s_approvers(
        self, demo: Path
    ) -> None:
        policy = demo / "policy.toml"
        policy.write_text(policy.read_text() + ASK_RULE)
        assert 'approvers = ["alice", "bob"]' in (demo / "campaign.toml").read_text()
        report = check_campaign(demo / "campaign.toml", env={})
        assert report.checked is not None, report.problems

    def test_an_ask_rule_with_approvers_passes(self, demo: Path) -> None:
        policy = demo / "policy.toml"
        policy.write_text(policy.read_text() + ASK_RULE + 'approvers = ["alice"]\n')
        report = check_campaign(demo / "campaign.toml", env={})
        assert report.checked is not None, report.problems

    def test_a_site_with_placeholders_left_is_refused_naming_each_field(self, demo: Path) -> None:
        site = ROOT / "site-configs" / "slurm.toml"
        report = check_campaign(demo / "campaign.toml", str(site), env={})
        assert report.site_only
        fields = [p.field for p in report.problems]
        assert fields == ["scheduler.account", "scheduler.partition", "scheduler.prologue.1"]
        assert all(p.file == str(site) for p in report.problems)
        assert "still holds the placeholder <YOUR_ALLOCATION>" in report.problems[0].text

    def test_a_site_whose_backend_package_is_missing_names_the_install_command(
        self, demo: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # as if not installed
        site = ROOT / "site-configs" / "slurm-local.toml"
        report = check_campaign(demo / "campaign.toml", str(site), env={})
        assert [p.field for p in report.problems] == ["backend.jobqueue"]
        assert "pip install 'unattended[jobqueue]'" in report.problems[0].text

    def test_a_relative_simulation_resolves_against_the_spec_folder_from_anywhere(
        self, demo: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from flows._engine._simulation import simulation_argv
        from flows._spec import load_campaign

        program = demo / "sim.sh"
        program.write_text("#!/bin/sh\necho '{\"value\": 1.0}'\n")  # the check runs it once
        program.chmod(0o755)
        spec = edit(demo / "campaign.toml", 'simulation = "demo"', 'simulation = ["./sim.sh"]')
        monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))

        report = check_campaign(spec, env={})

        assert report.checked is not None, report.problems
        assert simulation_argv(load_campaign(spec))[0] == str(program)  # what the runner runs

    def test_a_missing_relative_simulation_is_named_as_written_and_as_resolved(
        self, demo: Path
    ) -> None:
        spec = edit(demo / "campaign.toml", 'simulation = "demo"', 'simulation = ["./nosim.sh"]')
        report = check_campaign(spec, env={})
        assert [p.text for p in report.problems] == [
            f"{spec}: field 'objective.simulation': ./nosim.sh (that is, {demo / 'nosim.sh'}): "
            "no such file"
        ]


class TestOddSpecPaths:
    """Every odd path is one line naming the file, exit 2, never a traceback."""

    def _check(self, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
        assert main(["check", str(path)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return err.splitlines()[0]

    def test_a_symlink_loop(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        (tmp_path / "a.toml").symlink_to(tmp_path / "b.toml")
        (tmp_path / "b.toml").symlink_to(tmp_path / "a.toml")
        line = self._check(tmp_path / "a.toml", capsys)
        assert line == f"error: {tmp_path / 'a.toml'}: is a symlink loop"

    def test_an_oversized_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        spec = tmp_path / "huge.toml"
        spec.write_bytes(b"#" * (2 * 1024 * 1024))
        line = self._check(spec, capsys)
        assert line.startswith(f"error: {spec}: is too large (2097152 bytes")

    def test_a_directory(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert self._check(tmp_path, capsys) == f"error: {tmp_path}: is a directory, not a file"

    @pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
    def test_an_unreadable_file(self, demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        spec = demo / "campaign.toml"
        spec.chmod(0)
        line = self._check(spec, capsys)
        assert line == f"error: {spec}: cannot be read (permission denied)"

    def test_a_policy_that_is_a_symlink_loop(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        (demo / "policy.toml").unlink()
        (demo / "policy.toml").symlink_to(demo / "policy.toml")
        line = self._check(demo / "campaign.toml", capsys)
        assert line.endswith(f"field 'policy': {demo / 'policy.toml'}: is a symlink loop")
