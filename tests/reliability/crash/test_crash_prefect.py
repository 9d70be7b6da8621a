"""Kill the flow-run process of a real Prefect deployment at a failpoint, resubmit, compare.

The runner (``CampaignService``, in this process) passes its environment to the
flow-run process it spawns, so ``UNATTENDED_FAILPOINTS`` set here arms the flow
run only. A killed run ends CRASHED; ``submit_campaign`` starts a new run of the
same deployment, which reads the provenance and finishes the campaign.
"""

from __future__ import annotations

from collections import Counter

import pytest

from flows._prefect._deployment import submit_campaign
from flows._prefect._service import CampaignService, approve_run, read_run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio,
    # The session's server start is bounded by start_server's own timeout.
    pytest.mark.timeout(240, func_only=True),
]


async def state_of(flow_run_id) -> str:
    return (await read_run(flow_run_id)).state.type.value


class TestPrefectFlowCrash:
    async def test_a_flow_run_killed_mid_batch_is_resubmitted_and_completes(
        self, prefect_server, tmp_path, model_server, reference, monkeypatch, make_campaign
    ):
        record, inferences, executions = reference
        campaign = make_campaign("crash-prefect-batch")
        monkeypatch.setenv("UNATTENDED_FAILPOINTS", "mid_batch:6")
        first = await submit_campaign(campaign.spec, state_dir=campaign.home)
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(first.flow_run_id) == "CRASHED"
        monkeypatch.delenv("UNATTENDED_FAILPOINTS")
        second = await submit_campaign(campaign.spec, state_dir=campaign.home)
        assert second.flow_run_id != first.flow_run_id
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(second.flow_run_id) == "COMPLETED"
        resumed = campaign.record()
        assert resumed.attempts == record.attempts
        assert resumed.decisions == record.decisions
        assert resumed.task_results == record.task_results
        assert model_server.requests == inferences
        assert campaign.executions() == executions + Counter({1: 2})

    async def test_a_run_killed_after_its_approval_is_recorded_reuses_the_answer(
        self,
        prefect_server,
        tmp_path,
        model_server,
        reference,
        monkeypatch,
        make_campaign,
        ask_options,
    ):
        record, inferences, executions = reference
        campaign = make_campaign("crash-prefect-approval", **ask_options)
        first = await submit_campaign(campaign.spec, state_dir=campaign.home)
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(first.flow_run_id) == "PAUSED"
        # The runner that suspended the run is gone; a new one resumes it and the
        # resumed flow-run process dies right after recording the answer.
        await approve_run(first.flow_run_id, approver="alice", comment="go")
        monkeypatch.setenv("UNATTENDED_FAILPOINTS", "after_approval_recorded:1")
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(first.flow_run_id) == "CRASHED"
        monkeypatch.delenv("UNATTENDED_FAILPOINTS")
        second = await submit_campaign(campaign.spec, state_dir=campaign.home)
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(second.flow_run_id) == "COMPLETED"
        assert campaign.approval_events() == [("crash-prefect-approval-r1-c1", "alice", "approved")]
        resumed = campaign.record()
        assert resumed.attempts == record.attempts
        assert [d for _, _, d in resumed.decisions] == ["continue", "suspend", "retry", "continue"]
        assert model_server.requests == inferences
        assert campaign.executions() == executions

    @pytest.mark.long
    async def test_a_run_killed_just_before_it_suspends_asks_again_after_resubmission(
        self,
        prefect_server,
        tmp_path,
        model_server,
        reference,
        monkeypatch,
        make_campaign,
        ask_options,
    ):
        record, inferences, executions = reference
        campaign = make_campaign("crash-prefect-suspend", **ask_options)
        monkeypatch.setenv("UNATTENDED_FAILPOINTS", "before_suspend:1")
        first = await submit_campaign(campaign.spec, state_dir=campaign.home)
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(first.flow_run_id) == "CRASHED"
        monkeypatch.delenv("UNATTENDED_FAILPOINTS")
        second = await submit_campaign(campaign.spec, state_dir=campaign.home)
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(second.flow_run_id) == "PAUSED"
        await approve_run(second.flow_run_id, approver="alice")
        await CampaignService(query_seconds=0.5, state_dir=campaign.home).run_once()
        assert await state_of(second.flow_run_id) == "COMPLETED"
        assert campaign.approval_events() == [("crash-prefect-suspend-r1-c1", "alice", "approved")]
        assert campaign.record().attempts == record.attempts
        assert model_server.requests == inferences
        assert campaign.executions() == executions
