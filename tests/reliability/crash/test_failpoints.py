"""The failpoints themselves: parsing, counting, the kill, the commit hook; the direct runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows._engine import _failpoints
from flows._engine._failpoints import ENV_VARIABLE, POINTS, Armed, parse_failpoints

PROJECT = Path(__file__).resolve().parents[3]


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=PROJECT,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(autouse=True)
def _disarmed() -> None:
    yield
    _failpoints.arm({})


class TestParse:
    def test_names_and_occurrences_are_read(self):
        assert parse_failpoints("after_gate:2, mid_batch:5") == {
            "after_gate": Armed(2, "kill"),
            "mid_batch": Armed(5, "kill"),
        }

    def test_a_name_without_occurrence_fires_at_the_first_pass(self):
        assert parse_failpoints("after_checkpoint") == {"after_checkpoint": Armed(1, "kill")}

    def test_an_action_is_read_after_the_occurrence(self):
        assert parse_failpoints("after_lease_released:1:stop,after_gate:2:kill") == {
            "after_lease_released": Armed(1, "stop"),
            "after_gate": Armed(2, "kill"),
        }

    def test_an_unknown_action_is_refused_by_name(self):
        with pytest.raises(ValueError, match="action of 'after_gate' must be one of kill, stop"):
            parse_failpoints("after_gate:1:pause")

    def test_an_unknown_name_is_refused_by_name(self):
        with pytest.raises(ValueError, match="unknown failpoint 'after_gaet'"):
            parse_failpoints("after_gaet:1")

    def test_a_bad_occurrence_is_refused(self):
        with pytest.raises(ValueError, match="must be an integer"):
            parse_failpoints("after_gate:two")
        with pytest.raises(ValueError, match=">= 1"):
            parse_failpoints("after_gate:0")

    def test_every_point_is_in_the_module_docstring(self):
        assert all(f"``{point}``" in (_failpoints.__doc__ or "") for point in POINTS)


class TestFailpoint:
    def test_an_unarmed_point_does_nothing(self):
        """A point not armed neither kills nor counts; the armed one still fires on time."""
        code = """
            from flows._engine._failpoints import failpoint
            for n in range(1, 5):
                failpoint("after_gate")  # not armed: passes, uncounted
                print(n, flush=True)
                failpoint("mid_batch")  # armed at its second pass
        """
        done = run_python(code, {ENV_VARIABLE: "mid_batch:2"})
        assert done.returncode == -signal.SIGKILL
        assert done.stdout.split() == ["1", "2"]
        # With nothing armed, every point passes here and nothing is counted.
        assert _failpoints.arm({}) == {}
        for point in POINTS:
            assert not _failpoints.armed(point)
            _failpoints.failpoint(point)
        assert _failpoints._HITS == {}

    def test_the_process_is_killed_at_the_armed_occurrence_only(self):
        code = """
            from flows._engine._failpoints import failpoint
            for n in range(1, 5):
                print(n, flush=True)
                failpoint("after_gate")
        """
        done = run_python(code, {ENV_VARIABLE: "after_gate:3"})
        assert done.returncode == -signal.SIGKILL
        assert done.stdout.split() == ["1", "2", "3"]

    def test_a_stop_halts_the_process_there_until_it_is_continued(self):
        """``:stop`` sends SIGSTOP at the armed pass; after SIGCONT the process goes on."""
        code = """
            from flows._engine._failpoints import failpoint
            for n in range(1, 4):
                failpoint("after_gate")
                print(n, flush=True)
        """
        clean = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
        process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=PROJECT,
            env=clean | {ENV_VARIABLE: "after_gate:2:stop"},
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "1"
            # Stopped at the second pass: waitpid reports it, the process is not gone.
            _pid, status = os.waitpid(process.pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status)
            assert os.WSTOPSIG(status) == signal.SIGSTOP
            os.kill(process.pid, signal.SIGCONT)
            rest, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        assert (process.returncode, rest.split()) == (0, ["2", "3"])

    def test_without_the_variable_the_process_runs_through(self):
        code = """
            from flows._engine._failpoints import failpoint
            for n in range(3):
                failpoint("after_gate")
            print("through")
        """
        done = run_python(code, {})
        assert (done.returncode, done.stdout.strip()) == (0, "through")

    def test_a_kill_inside_a_commit_leaves_the_transaction_undone(self, tmp_path):
        database = tmp_path / "t.db"
        code = f"""
            from types import SimpleNamespace
            from sqlalchemy import create_engine, text
            from flows._engine._failpoints import failpoint_in_commit
            engine = create_engine("sqlite:///{database}")
            with engine.begin() as c:
                c.execute(text("CREATE TABLE t (x INTEGER)"))
            with failpoint_in_commit(SimpleNamespace(engine=engine), "checkpoint_commit"):
                with engine.begin() as c:
                    c.execute(text("INSERT INTO t VALUES (1)"))
            print("committed")
        """
        done = run_python(code, {ENV_VARIABLE: "checkpoint_commit:1"})
        assert done.returncode == -signal.SIGKILL
        import sqlite3

        with sqlite3.connect(database) as connection:
            assert connection.execute("SELECT count(*) FROM t").fetchone() == (0,)


class TestDirectRunner:
    def test_a_bad_spec_exits_2_naming_the_file(self, tmp_path):
        spec = tmp_path / "campaign.toml"
        spec.write_text('name = "Bad Name"\n')
        done = subprocess.run(
            [sys.executable, "-m", "flows._cli._direct", str(spec), "--state-dir", str(tmp_path)],
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert str(spec) in done.stderr

    def test_an_ask_escalates_and_exits_4(self, make_campaign):
        policy = """\
[policy]
name = "ask"

[[rules]]
name = "ask-first"
description = "Ask before the first batch."
advice = "Approve."
severity = "ASK"
when = "round.index == 0"
approvers = ["alice"]
"""
        campaign = make_campaign("direct-ask", policy=policy)
        done = campaign.run_direct()
        assert done.returncode == 4
        line = json.loads(done.stdout.strip().splitlines()[-1])
        assert (line["status"], line["error_code"]) == ("escalated", "policy_denied")
