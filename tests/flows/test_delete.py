"""``unattended delete NAME``: the deployment, its runs and the registration go; the record stays.

Through the real command line (a fresh interpreter per command) against the
session's Prefect server. A campaign is submitted with ``unattended submit`` and
run by the runner (``CampaignService``, driven in this process). Without
``--purge`` the provenance is kept, a ``deleted`` event is recorded, and the
campaign submitted again continues from its record (nothing runs twice); with
``--purge`` it is gone (``inspect`` says so) and submitted again it starts afresh.
A campaign with an active run is refused; so is a delete nobody confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import pty
import select
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flows._prefect._rest import request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

PROJECT = Path(__file__).resolve().parents[2]
EXAMPLES = PROJECT / "examples" / "demo"


@dataclass
class Campaign:
    """A one-round demo campaign under its own name and state directory."""

    name: str
    folder: Path

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def spec(self) -> Path:
        return self.folder / "campaign.toml"

    @property
    def database(self) -> Path:
        return self.home / "campaigns" / self.name / "provenance.db"

    @property
    def registration(self) -> Path:
        return self.home / "campaigns" / self.name / "registration.json"

    def env(self) -> dict[str, str]:
        return {**os.environ, "UNATTENDED_HOME": str(self.home)}

    def cli(self, *args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flows._cli", *args],
            cwd=PROJECT,
            env=self.env(),
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def submit(self) -> str:
        """Submit the campaign in this process (the commands under test run as subprocesses)."""
        from flows._prefect._deployment import submit_campaign

        return str(asyncio.run(submit_campaign(self.spec, state_dir=self.home)).flow_run_id)

    def submit_with_the_cli(self) -> str:
        done = self.cli("submit", str(self.spec))
        assert done.returncode == 0, done.stderr
        return done.stdout.split("flow run ", 1)[1].split()[0]

    def stop(self, run_id: str) -> None:
        """End a run that never started, as the UI's Cancel ends a scheduled one."""
        request(
            os.environ,
            "POST",
            f"flow_runs/{run_id}/set_state",
            {"state": {"type": "CANCELLED", "name": "Cancelled"}, "force": True},
        )

    def serve_once(self) -> None:
        """Run what is due with a real runner for this state directory, until it is done."""
        from flows._prefect._service import CampaignService

        asyncio.run(CampaignService(query_seconds=0.5, state_dir=self.home).run_once())

    def deployment_id(self) -> str:
        return str(json.loads(self.registration.read_text())["deployment_id"])

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(f"file:{self.database}?mode=ro", uri=True)) as c:
            return [tuple(r) for r in c.execute(sql)]


def runs_of(deployment_id: str) -> list[dict[str, Any]]:
    body = {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}, "limit": 200, "offset": 0}
    return list(request(os.environ, "POST", "flow_runs/filter", body))


def deployment_exists(deployment_id: str) -> bool:
    body = {"deployments": {"id": {"any_": [deployment_id]}}}
    return bool(request(os.environ, "POST", "deployments/filter", body))


@pytest.fixture
def campaign(prefect_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Campaign:
    name = f"del-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    shutil.copytree(EXAMPLES, folder)
    spec = folder / "campaign.toml"
    text = spec.read_text().replace('name = "demo"', f'name = "{name}"', 1)
    spec.write_text(text.replace("rounds = 4", "rounds = 1"))
    # The runner driven here sets it for its flow runs; monkeypatch puts it back after.
    monkeypatch.setenv("UNATTENDED_HOME", str(folder / "home"))
    return Campaign(name, folder)


def completed(campaign: Campaign) -> str:
    """Submit the campaign, run it to the end, and return its run's id."""
    run_id = campaign.submit()
    campaign.serve_once()
    (run,) = runs_of(campaign.deployment_id())
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert campaign.rows("SELECT status FROM campaign") == [("completed",)]
    return run_id


class TestDeleteKeepsTheRecord:
    def test_the_deployment_runs_and_registration_go_and_the_provenance_stays(
        self, campaign: Campaign
    ) -> None:
        completed(campaign)
        deployment = campaign.deployment_id()
        tasks_before = campaign.rows("SELECT COUNT(*) FROM task_result")

        deleted = campaign.cli("delete", campaign.name, "--yes")

        assert deleted.returncode == 0, deleted.stderr
        assert f"deleted campaign {campaign.name}" in deleted.stdout
        assert "1 flow run(s) removed from the Prefect server" in deleted.stdout
        assert f"provenance kept in {campaign.database}" in deleted.stdout
        assert not deployment_exists(deployment)
        assert runs_of(deployment) == []
        assert not campaign.registration.exists()
        assert campaign.rows("SELECT status FROM campaign") == [("completed",)]
        assert campaign.rows("SELECT kind, actor FROM campaign_event WHERE kind = 'deleted'") == [
            ("deleted", getpass.getuser())
        ]
        shown = campaign.cli("inspect", campaign.name)
        assert shown.returncode == 0, shown.stderr
        assert f"Campaign {campaign.name}: completed" in shown.stdout
        status = campaign.cli("status", campaign.name)
        assert status.returncode == 2
        assert "neither a flow run id nor a campaign submitted" in status.stderr

        # Submitted again, it continues from its record: a completed campaign runs nothing.
        campaign.submit_with_the_cli()
        campaign.serve_once()
        (again,) = runs_of(campaign.deployment_id())
        assert again["state"]["type"] == "COMPLETED"
        assert campaign.rows("SELECT COUNT(*) FROM task_result") == tasks_before

    def test_a_campaign_whose_spec_is_gone_is_deleted_and_its_record_kept(
        self, campaign: Campaign
    ) -> None:
        campaign.stop(campaign.submit())
        deployment = campaign.deployment_id()
        campaign.spec.unlink()

        deleted = campaign.cli("delete", campaign.name, "--yes")

        assert deleted.returncode == 0, deleted.stderr
        assert f"provenance kept in {campaign.database} (a 'deleted' event" in deleted.stdout
        assert not deployment_exists(deployment)
        assert campaign.rows("SELECT kind FROM campaign_event WHERE kind = 'deleted'") == [
            ("deleted",)
        ]

    def test_an_unknown_campaign_is_one_line_and_exit_2(self, campaign: Campaign) -> None:
        unknown = campaign.cli("delete", "no-such-campaign", "--yes")
        assert unknown.returncode == 2
        assert unknown.stderr.startswith("error: no campaign named 'no-such-campaign'")
        assert "Traceback" not in unknown.stderr


class TestDeleteWhileTheRunnerServes:
    def test_the_runner_serving_meanwhile_runs_the_campaign_submitted_again(
        self, campaign: Campaign
    ) -> None:
        served = campaign.cli("serve", "--detach", "--query-seconds", "0.5")
        assert served.returncode == 0, served.stderr
        try:
            campaign.submit_with_the_cli()
            wait_for(lambda: ended(campaign.deployment_id()), "the first run to end")
            old = campaign.deployment_id()

            deleted = campaign.cli("delete", campaign.name, "--purge", "--yes")
            assert deleted.returncode == 0, deleted.stderr
            assert not deployment_exists(old)

            campaign.submit_with_the_cli()
            new = campaign.deployment_id()
            assert new != old
            (run,) = wait_for(lambda: ended(new), "the new run to end")
            assert run["state"]["type"] == "COMPLETED", run["state"]
            assert campaign.rows("SELECT status FROM campaign") == [("completed",)]
            # The runner still knew the deleted deployment: nothing of it went wrong.
            assert "Traceback" not in (campaign.home / "runner.log").read_text()
        finally:
            campaign.cli("serve", "--stop")


def ended(deployment_id: str) -> list[dict[str, Any]]:
    """Return the deployment's runs once every one has ended (else an empty list)."""
    runs = runs_of(deployment_id)
    over = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    return runs if runs and all(r["state"]["type"] in over for r in runs) else []


def wait_for(condition: Any, what: str, timeout: float = 150.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


class TestDeletePurge:
    def test_purge_removes_the_record_and_a_new_submission_starts_afresh(
        self, campaign: Campaign
    ) -> None:
        completed(campaign)
        first = campaign.rows("SELECT created_at FROM campaign")

        deleted = campaign.cli("delete", campaign.name, "--purge", "--yes")

        assert deleted.returncode == 0, deleted.stderr
        assert "provenance purged:" in deleted.stdout
        assert not campaign.database.parent.exists()
        shown = campaign.cli("inspect", campaign.name)
        assert shown.returncode == 2
        assert f"no campaign named {campaign.name} in" in shown.stderr

        campaign.submit_with_the_cli()
        campaign.serve_once()
        (fresh,) = runs_of(campaign.deployment_id())
        assert fresh["state"]["type"] == "COMPLETED"
        assert campaign.rows("SELECT status FROM campaign") == [("completed",)]
        assert campaign.rows("SELECT created_at FROM campaign") != first
        assert campaign.rows("SELECT COUNT(*) FROM round") == [(1,)]
        assert campaign.rows("SELECT kind FROM campaign_event WHERE kind = 'deleted'") == []


class TestDeleteRefuses:
    def test_a_campaign_with_an_active_run_is_refused_until_it_is_cancelled(
        self, campaign: Campaign
    ) -> None:
        run_id = campaign.submit()  # no runner: the run stays Scheduled
        deployment = campaign.deployment_id()

        refused = campaign.cli("delete", campaign.name, "--yes")

        assert refused.returncode == 2
        assert f"campaign {campaign.name!r} has an active run: {run_id}" in refused.stderr
        assert f"'unattended cancel {campaign.name}'" in refused.stderr
        assert "nothing was deleted" in refused.stderr
        assert deployment_exists(deployment)
        assert [r["id"] for r in runs_of(deployment)] == [run_id]
        assert campaign.registration.exists()

        assert campaign.cli("cancel", campaign.name, "--wait", "0").returncode == 0
        deleted = campaign.cli("delete", campaign.name, "--yes")
        assert deleted.returncode == 0, deleted.stderr
        assert not deployment_exists(deployment)

    def test_without_a_terminal_and_without_yes_nothing_is_deleted(
        self, campaign: Campaign
    ) -> None:
        campaign.stop(campaign.submit())
        deployment = campaign.deployment_id()

        refused = campaign.cli("delete", campaign.name)

        assert refused.returncode == 2
        assert "no terminal to ask for confirmation on; pass --yes" in refused.stderr
        assert deployment_exists(deployment)
        assert len(runs_of(deployment)) == 1
        assert campaign.registration.exists()

    def test_at_a_terminal_only_the_typed_name_confirms(self, campaign: Campaign) -> None:
        campaign.stop(campaign.submit())
        deployment = campaign.deployment_id()

        wrong, output = at_a_terminal(campaign, ["delete", campaign.name], "demo\n")
        assert wrong == 2, output
        assert "nothing was deleted" in output
        assert deployment_exists(deployment)

        right, output = at_a_terminal(campaign, ["delete", campaign.name], f"{campaign.name}\n")
        assert right == 0, output
        assert "1 flow run(s)" in output  # what it removes is said before asking
        assert f"deleted campaign {campaign.name}" in output
        assert not deployment_exists(deployment)


def at_a_terminal(campaign: Campaign, args: list[str], typed: str) -> tuple[int, str]:
    """Run ``unattended ARGS`` on a pseudo-terminal, type ``typed`` at its prompt."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "flows._cli", *args],
        cwd=PROJECT,
        env=campaign.env(),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        close_fds=True,
    )
    os.close(terminal)
    seen = b""
    answered = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the other end closed: the command ended
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"to delete it: " in seen:
                os.write(controller, typed.encode())
                answered = True
            if process.poll() is not None and not ready:
                break
        return process.wait(timeout=60), seen.decode(errors="replace")
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
