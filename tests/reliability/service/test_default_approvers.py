"""An ASK rule naming no approvers is answered by the campaign's ``[approvals] approvers``.

Through the real server and runner: the approval demo with its rule's own approvers
removed and the spec naming ``carol`` passes ``check``, suspends at round 2 with a
request that allows carol only (recorded so), refuses alice, and carol's approval
runs the round.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from uuid import UUID

import pytest
from service_helpers import campaign_db, demo_copy, sqlite_rows  # type: ignore[import-not-found]

from flows._prefect._rest import ResumeRefusedError, request
from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

NAME = "default-approvers"


def test_the_campaign_s_approvers_answer_a_rule_that_names_none(
    prefect_server: ServerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows._check import check_campaign
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService, approve_run

    spec = demo_copy(
        tmp_path / "spec",
        "campaign-approval.toml",
        NAME,
        rounds="3",
        approvals__approvers='["carol"]',
    )
    policy = tmp_path / "spec" / "approval-policy.toml"
    text = policy.read_text()
    assert 'approvers = ["alice", "bob"]\n' in text
    policy.write_text(text.replace('approvers = ["alice", "bob"]\n', ""))
    report = check_campaign(spec, env={})
    assert report.checked is not None, report.problems

    home = tmp_path / "home"
    monkeypatch.setenv("PREFECT_LOCAL_STORAGE_PATH", str(tmp_path / "results"))
    submitted = asyncio.run(submit_campaign(spec, state_dir=home))
    service = CampaignService(query_seconds=0.5, state_dir=home)
    env = client_env(prefect_server)

    def state(run_id: UUID) -> str:
        return str(request(env, "GET", f"flow_runs/{run_id}", None)["state"]["type"])

    def events() -> list[tuple[str, str | None, str]]:
        return [
            (row[0], row[1], row[2])
            for row in sqlite_rows(
                campaign_db(home, NAME),
                "SELECT e.decision, e.refusal, e.decided_by FROM approval_event e "
                "JOIN approval a ON a.id = e.approval_id ORDER BY e.id",
            )
        ]

    try:
        asyncio.run(service.run_once())
        assert state(submitted.flow_run_id) == "PAUSED"
        (allowed,) = sqlite_rows(campaign_db(home, NAME), "SELECT approvers_allowed FROM approval")
        assert json.loads(allowed[0]) == ["carol"]

        # The form offers the campaign's approvers: the rule's old ones are no answer.
        with pytest.raises(ResumeRefusedError, match="'alice' is not one of \\['carol'"):
            asyncio.run(approve_run(submitted.flow_run_id, approver="alice"))
        assert state(submitted.flow_run_id) == "PAUSED"
        assert events() == []

        asyncio.run(approve_run(submitted.flow_run_id, approver="carol"))
        asyncio.run(service.run_once())
        assert state(submitted.flow_run_id) == "COMPLETED"
        assert events()[-1][0::2] == ("approved", "carol")
        (batches,) = sqlite_rows(
            campaign_db(home, NAME), "SELECT COUNT(*) FROM batch WHERE round_index = 2"
        )
        assert batches[0] == 1
    finally:
        os.environ.pop("UNATTENDED_HOME", None)
