"""``unattended run`` on a simulation that prints text: its tasks failed, the run exits non-zero.

Through the real command (its own process), a real Prefect server, the real runner it
starts, real executables and the campaign's SQLite provenance. Before, the same
campaign printed "8 done, 0 failed", ended Completed and exited 0.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UNATTENDED = Path(sys.executable).parent / "unattended"

BUDGET = """\
[policy]
name = "budget"

[[rules]]
name = "over-budget"
description = "The campaign has spent its budget."
severity = "HARD_STOP"
when = "budget.remaining < 0.0"
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Login:
    """One user's shell on the login node: the session's server, a private state directory."""

    def __init__(self, folder: Path, server: ServerHandle) -> None:
        self.home = folder / "home"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("UNATTENDED_", "PREFECT_", "SLURM_")) and k != "DO_NOT_TRACK"
        }
        self.env |= client_env(server)
        self.env |= {
            "UNATTENDED_HOME": str(self.home),
            "UNATTENDED_SERVER_PORT": str(_free_port()),
            "PREFECT_LOCAL_STORAGE_PATH": str(folder / "prefect-results"),
            "PATH": f"{UNATTENDED.parent}{os.pathsep}{self.env.get('PATH', '')}",
        }

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(UNATTENDED), *args],
            env=self.env | extra,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )


@pytest.fixture
def login(prefect_server: ServerHandle, tmp_path: Path) -> Iterator[Login]:
    shell = Login(tmp_path, prefect_server)
    try:
        yield shell
    finally:
        shell.cli("serve", "--stop")  # the runner `run` started, by its pid file


class TestRunOfABadSimulation:
    def test_run_counts_every_task_failed_and_exits_non_zero(self, login, fault_campaign):
        campaign = fault_campaign("badout-run")
        spec = campaign.write({"*": "text"}, rounds=1, policy=BUDGET)
        login.env["UNATTENDED_HOME"] = str(campaign.home)  # where campaign.rows() reads

        # The check's own run would refuse it first; this is what happens without it.
        ran = login.cli("run", str(spec), UNATTENDED_CHECK_SIMULATION="never")

        assert ran.returncode == 1, ran.stdout + ran.stderr
        assert "batch finished: 0 done, 4 failed" in ran.stdout, ran.stdout
        assert "bad_output" in ran.stdout, ran.stdout
        assert campaign.campaign_row() == ("failed", "bad_output")
        statuses = {(r["status"], r["error_code"]) for r in campaign.task_results().values()}
        assert statuses == {("failed", "bad_output")}
        status = login.cli("status", "badout-run", "--json")
        assert status.returncode in (0, 1), status.stderr
        assert "bad_output" in status.stdout, status.stdout

    def test_check_runs_it_once_and_refuses_it_naming_the_simulation_and_the_code(
        self, login, fault_campaign
    ):
        campaign = fault_campaign("badout-check")
        spec = campaign.write({"*": "text"}, rounds=1, policy=BUDGET)

        checked = login.cli("check", str(spec))

        assert checked.returncode == 2, checked.stdout + checked.stderr
        [line] = [line for line in checked.stderr.splitlines() if "objective.simulation" in line]
        assert "simulation argv-" in line, line
        assert "faulty_simulation.py" in line, line
        assert "stdout is not JSON (bad_output): 'hi'" in line, line
        assert "ran once on round 0's first fallback candidate" in line, line
        skipped = login.cli("check", str(spec), "--no-run-simulation")
        assert skipped.returncode == 0, skipped.stderr

    def test_run_refuses_it_before_anything_is_submitted_when_the_check_run_is_on(
        self, login, fault_campaign
    ):
        campaign = fault_campaign("badout-always")
        spec = campaign.write({"*": "novalue"}, rounds=1, policy=BUDGET)
        login.env["UNATTENDED_HOME"] = str(campaign.home)

        ran = login.cli("run", str(spec), UNATTENDED_CHECK_SIMULATION="always")

        assert ran.returncode == 2, ran.stdout + ran.stderr
        assert "wrote no value the objective reads (bad_output)" in ran.stderr, ran.stderr
        assert not campaign.database.exists()  # nothing submitted, nothing recorded
