"""``--json`` on ``status``, ``approvals`` and ``check``: one JSON document on stdout, same exits.

Through the real command line (a fresh interpreter per command). ``status`` and
``approvals`` run against the session's Prefect server and a demo campaign whose run
is suspended on its round-0 approval; ``check`` needs no server.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parents[2]
EXAMPLES = PROJECT / "examples" / "demo"


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows._cli", *args],
        cwd=PROJECT,
        env={**os.environ, "UNATTENDED_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def document(done: subprocess.CompletedProcess[str]) -> Any:
    """Return the command's stdout as JSON: the whole of it, nothing before or after."""
    return json.loads(done.stdout)


@dataclass(frozen=True)
class Waiting:
    """A demo campaign whose run is suspended, waiting for alice or bob."""

    home: Path
    name: str
    flow_run_id: str


@pytest.fixture(scope="module")
def waiting(prefect_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Waiting:
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService, read_run

    folder = tmp_path_factory.mktemp("cli-json")
    for item in EXAMPLES.iterdir():
        shutil.copy(item, folder / item.name)
    spec = folder / "campaign-approval.toml"
    spec.write_text(spec.read_text().replace('name = "demo-approval"', 'name = "cli-json"'))
    policy = folder / "approval-policy.toml"
    policy.write_text(policy.read_text().replace("round.index == 2", "round.index == 0"))
    home = folder / "home"
    saved = os.environ.get("UNATTENDED_HOME")

    async def until_suspended() -> str:
        submitted = await submit_campaign(spec, state_dir=home)
        await CampaignService(query_seconds=0.5, state_dir=home).run_once()
        run = await read_run(submitted.flow_run_id)
        assert run.state is not None
        assert run.state.type.value == "PAUSED"
        return str(submitted.flow_run_id)

    try:
        flow_run_id = asyncio.run(until_suspended())
    finally:  # the runner sets it for its flow runs
        if saved is None:
            os.environ.pop("UNATTENDED_HOME", None)
        else:
            os.environ["UNATTENDED_HOME"] = saved
    return Waiting(home, "cli-json", flow_run_id)


@pytest.mark.integration
@pytest.mark.timeout(300)
class TestStatusJson:
    def test_the_list_is_one_document_with_the_waiting_run(self, waiting: Waiting) -> None:
        done = cli("status", "--json", home=waiting.home)

        assert done.returncode == 0, done.stderr
        (run,) = document(done)["runs"]
        assert run["id"] == waiting.flow_run_id
        assert run["campaign"] == waiting.name
        assert (run["state_type"], run["state"]) == ("PAUSED", "Suspended")
        assert run["ui_url"].endswith(waiting.flow_run_id)

    def test_the_text_list_has_a_header_row_over_its_runs(self, waiting: Waiting) -> None:
        """Without --json: one header row naming the columns, then one line per run."""
        done = cli("status", home=waiting.home)

        assert done.returncode == 0, done.stderr
        header, row = done.stdout.splitlines()[:2]
        assert header.split() == ["flow", "run", "campaign", "state", "UI"]
        assert row.split()[:3] == [waiting.flow_run_id, waiting.name, "Suspended"]
        assert row.index(waiting.name) == header.index("campaign")

    def test_a_campaign_name_shows_its_run_and_what_it_waits_for(self, waiting: Waiting) -> None:
        done = cli("status", waiting.name, "--json", home=waiting.home)

        assert done.returncode == 0, done.stderr
        shown = document(done)
        assert shown["id"] == waiting.flow_run_id
        assert shown["ours"] is True
        approval = shown["approval"]
        assert approval["flow_run_id"] == waiting.flow_run_id
        assert approval["approvers"] == ["alice", "bob"]
        assert approval["rule"]
        assert approval["deadline"] > approval["requested_at"]
        assert approval["approve"] == f"unattended approve {waiting.flow_run_id} --as NAME"

    def test_another_state_directory_lists_no_runs(self, waiting: Waiting, tmp_path: Path) -> None:
        done = cli("status", "--json", home=tmp_path / "elsewhere")

        assert done.returncode == 0, done.stderr
        assert document(done) == {"runs": []}

    def test_an_unknown_campaign_is_exit_2_with_nothing_on_stdout(self, waiting: Waiting) -> None:
        done = cli("status", "no-such-campaign", "--json", home=waiting.home)

        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr.startswith("error: 'no-such-campaign' is neither a flow run id")


@pytest.mark.integration
@pytest.mark.timeout(300)
class TestApprovalsJson:
    def test_the_waiting_request_with_its_rule_and_approvers(self, waiting: Waiting) -> None:
        done = cli("approvals", "--json", home=waiting.home)

        assert done.returncode == 0, done.stderr
        (approval,) = document(done)["approvals"]
        assert approval["flow_run_id"] == waiting.flow_run_id
        assert approval["campaign"] == waiting.name
        assert approval["approvers"] == ["alice", "bob"]
        assert approval["key"].startswith(f"{waiting.name}-r0-")

    def test_another_state_directory_has_none(self, waiting: Waiting, tmp_path: Path) -> None:
        done = cli("approvals", "--json", home=tmp_path / "elsewhere")

        assert done.returncode == 0, done.stderr
        assert document(done) == {"approvals": []}


class TestCheckJson:
    def test_a_campaign_that_checks_out(self, tmp_path: Path) -> None:
        done = cli("check", str(EXAMPLES / "campaign.toml"), "--json", home=tmp_path)

        assert done.returncode == 0, done.stderr
        assert document(done) == {
            "ok": True,
            "campaign": "demo",
            "spec": str(EXAMPLES / "campaign.toml"),
            "rounds": 4,
            "batch_size": 8,
            "site": "local",
            "policy_rules": 3,
        }

    def test_every_problem_is_an_error_naming_its_file_and_field(self, tmp_path: Path) -> None:
        site = PROJECT / "site-configs" / "slurm.toml"
        args = ("check", str(EXAMPLES / "campaign.toml"), "--site", str(site))

        done = cli(*args, "--json", home=tmp_path)

        assert done.returncode == 2 == cli(*args, home=tmp_path).returncode
        assert done.stderr == ""
        refused = document(done)
        assert refused["ok"] is False
        assert refused["code"] == "site_invalid"
        fields = [(e["file"], e["field"]) for e in refused["errors"]]
        assert (str(site), "scheduler.account") in fields
        account = refused["errors"][fields.index((str(site), "scheduler.account"))]
        assert "<YOUR_ALLOCATION>" in account["message"]

    def test_a_missing_spec_is_a_refusal_too(self, tmp_path: Path) -> None:
        missing = tmp_path / "nowhere.toml"

        done = cli("check", str(missing), "--json", home=tmp_path)

        assert done.returncode == 2
        refused = document(done)
        assert refused["ok"] is False
        assert refused["code"] == "spec_invalid"
        assert refused["errors"] == [
            {"file": str(missing), "field": None, "message": f"{missing}: no such file"}
        ]
