"""A campaign with an approval, driven through the real CLI: private files, piped output, logs.

One campaign (the demo's approval spec, two rounds, round 1 waits for a human) runs
against the session's Prefect server: ``unattended run --no-wait`` starts the
detached runner and returns when round 1 waits, ``unattended approve`` answers,
``unattended run`` follows it to the end, ``unattended serve --stop`` stops the
runner. Then:

- every folder under the state directory is 0700 and every file 0600, and so are
  the files of the Prefect server the session started with the project's code;
- ``status``, ``submit``, ``run`` (following), ``inspect`` and ``--help`` write into
  a pipe whose reader is gone (``| head`` after its first line) and end with exit 0
  and no traceback;
- the runner's log shows the approval request's ``Finished in state Suspended``
  at INFO, never at ERROR;
- running the finished campaign again shows its stored record.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from service_helpers import demo_copy  # type: ignore[import-not-found]

from flows._prefect._server import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

NAME = "private-files"
UNATTENDED = str(Path(sys.executable).parent / "unattended")
# Commands whose output goes into a closed pipe while the campaign waits for approval
# (submit and run find the active run: nothing new is registered), and after it ended.
PIPED_WHILE_WAITING = {
    "status": ["status"],
    "submit": ["submit", "SPEC"],
    "run-following": ["run", "SPEC", "--no-wait"],
}
PIPED_AFTER = {"inspect": ["inspect"], "help": ["--help"]}


def cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [UNATTENDED, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def closed_pipes(env: dict[str, str], commands: dict[str, list[str]]) -> dict[str, Piped]:
    """Run CLI commands side by side, each with stdout a pipe whose reader has already gone."""
    started = {}
    for name, args in commands.items():
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            started[name] = subprocess.Popen(
                [UNATTENDED, *args], env=env, stdout=write_end, stderr=subprocess.PIPE, text=True
            )
        finally:
            os.close(write_end)
    results = {}
    for name, process in started.items():
        _, stderr = process.communicate(timeout=120)
        results[name] = Piped(process.returncode, stderr)
    return results


@dataclass(frozen=True)
class Piped:
    """How a command with a closed stdout ended."""

    returncode: int
    stderr: str


@pytest.fixture(scope="module")
def finished(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Run the campaign to the end through the CLI; return its state dir and the piped runs."""
    folder = tmp_path_factory.mktemp("private")
    home = folder / "home"
    env = {**os.environ, "UNATTENDED_HOME": str(home)}
    env["PREFECT_LOCAL_STORAGE_PATH"] = str(folder / "results")
    spec = demo_copy(folder / "spec", "campaign-approval.toml", NAME, rounds="2")
    policy = spec.parent / "approval-policy.toml"
    policy.write_text(policy.read_text().replace("round.index == 2", "round.index == 1"))
    piped: dict[str, Piped] = {}

    def pipe_all(commands: dict[str, list[str]]) -> None:
        named = {n: [str(spec) if a == "SPEC" else a for a in c] for n, c in commands.items()}
        piped.update(closed_pipes(env, named))

    try:
        waiting = cli(env, "run", str(spec), "--no-wait")
        assert waiting.returncode == 5, waiting.stdout + waiting.stderr
        flow_run_id = re.search(r"flow run ([0-9a-f-]{36})", waiting.stdout)
        assert flow_run_id is not None, waiting.stdout
        pipe_all(PIPED_WHILE_WAITING)
        approved = cli(env, "approve", flow_run_id.group(1), "--as", "alice")
        assert approved.returncode == 0, approved.stdout + approved.stderr
        done = cli(env, "run", str(spec))
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        cli(env, "serve", "--stop", timeout=60)
    pipe_all(PIPED_AFTER)
    return {
        "home": home,
        "env": env,
        "spec": spec,
        "server_home": prefect_server.prefect_home,
        "piped": piped,
    }


def loose_modes(root: Path) -> dict[str, str]:
    """Return every path under ``root`` whose mode is not private, with its mode."""
    loose = {}
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            continue
        wanted = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
        if stat.S_IMODE(info.st_mode) != wanted:
            loose[str(path.relative_to(root))] = oct(stat.S_IMODE(info.st_mode))
    return loose


class TestPrivateFiles:
    def test_everything_under_the_state_directory_is_private(
        self, finished: dict[str, Any]
    ) -> None:
        home: Path = finished["home"]
        written = {p.name for p in (home / "campaigns" / NAME).iterdir()}
        assert {"provenance.db", "telemetry.jsonl", "answers.jsonl"} <= written, written
        assert (home / "runner.log").is_file()
        assert loose_modes(home) == {}

    def test_the_prefect_servers_files_are_private(self, finished: dict[str, Any]) -> None:
        server_home: Path = finished["server_home"]
        assert (server_home / "server.log").is_file()
        # The TLS certificate is public by design (co-approvers hold copies; 0644 in a
        # 0700 folder); its key, like everything else, is private.
        assert loose_modes(server_home) == {"tls/server.pem": "0o644"}


class TestPipedOutput:
    @pytest.mark.parametrize("command", [*PIPED_WHILE_WAITING, *PIPED_AFTER])
    def test_a_closed_pipe_ends_cleanly(self, finished: dict[str, Any], command: str) -> None:
        result = finished["piped"][command]
        assert "Traceback" not in result.stderr, result.stderr
        assert "BrokenPipeError" not in result.stderr, result.stderr
        assert result.returncode == 0, result.stderr


class TestRunnerLog:
    def test_an_approval_request_is_logged_at_info_not_error(
        self, finished: dict[str, Any]
    ) -> None:
        lines = (finished["home"] / "runner.log").read_text().splitlines()
        suspended = [line for line in lines if "Finished in state Suspended" in line]
        assert suspended, "the runner's log shows no suspended flow run"
        assert all("| INFO " in line for line in suspended), suspended


class TestRunAgain:
    def test_a_finished_campaign_shows_its_stored_record_and_submits_nothing(
        self, finished: dict[str, Any]
    ) -> None:
        again = cli(finished["env"], "run", str(finished["spec"]))
        assert again.returncode == 0, again.stderr
        assert f"campaign {NAME} already completed; showing the stored record" in again.stdout
        assert "round 1: completed" in again.stdout
        assert "submitted" not in again.stdout

    def test_a_changed_spec_under_the_finished_name_is_refused_before_anything_runs(
        self, finished: dict[str, Any]
    ) -> None:
        spec: Path = finished["spec"]
        changed = spec.with_name("changed.toml")
        changed.write_text(spec.read_text().replace("attempts = 3", "attempts = 2"))
        again = cli(finished["env"], "run", str(changed))
        assert again.returncode == 2, again.stdout + again.stderr
        assert f"error: {changed}: field 'attempts': campaign '{NAME}' is recorded with" in (
            again.stderr
        )
        assert "another spec: attempts (3 -> 2) differs" in again.stderr
        assert again.stdout == ""
