"""A campaign end to end: real Prefect server, real runner, real executables, real database."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flows._prefect._deployment import submit_campaign
from flows._prefect._service import CampaignService, approve_run, read_run
from flows._provenance import ProvenanceStore

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


def demo_copy(tmp_path: Path, spec: str, **replace: str) -> Path:
    """Copy the demo campaign into ``tmp_path`` (its own name per test), return the spec path."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    path = tmp_path / spec
    text = path.read_text()
    for old, new in replace.items():
        text = text.replace(old, new)
    path.write_text(text)
    return path


async def state_of(flow_run_id) -> str:
    return (await read_run(flow_run_id)).state.type.value


class TestCampaignCompletes:
    async def test_the_demo_campaign_completes_with_everything_recorded(
        self, prefect_server, tmp_path
    ):
        spec = demo_copy(tmp_path, "campaign.toml", **{'name = "demo"': 'name = "e2e-complete"'})
        home = tmp_path / "home"
        submitted = await submit_campaign(spec, state_dir=home)
        service = CampaignService(query_seconds=0.5, state_dir=home)
        await service.run_once()
        assert await state_of(submitted.flow_run_id) == "COMPLETED"
        store = ProvenanceStore.open(home / "campaigns" / "e2e-complete")
        summary = store.summary("e2e-complete")
        store.close()
        assert summary["campaign"]["status"] == "completed"


class TestApproval:
    async def test_suspends_then_resumes_through_the_resume_api_and_completes(
        self, prefect_server, tmp_path
    ):
        spec = demo_copy(
            tmp_path, "campaign-approval.toml", **{'name = "demo-approval"': 'name = "e2e-approve"'}
        )
        home = tmp_path / "home"
        submitted = await submit_campaign(spec, state_dir=home)
        service = CampaignService(query_seconds=0.5, state_dir=home)
        await service.run_once()
        assert await state_of(submitted.flow_run_id) == "PAUSED"
        await approve_run(submitted.flow_run_id, approver="alice", comment="looks fine")
        await service.run_once()
        assert await state_of(submitted.flow_run_id) == "COMPLETED"
        store = ProvenanceStore.open(home / "campaigns" / "e2e-approve")
        approval = store.find_approval("e2e-approve-r2-c1")
        store.close()
        assert approval.decision == "approved"
        assert approval.decided_by == "alice"
        assert approval.flow_run_id == str(submitted.flow_run_id)


class TestRunnerServesItsOwnStateDirectory:
    async def test_only_deployments_registered_in_its_state_directory_are_served(
        self, prefect_server, tmp_path
    ):
        """Two users, one server: a runner never runs the other's campaign under its uid.

        Nor a deployment made on the server by hand that names the runner's state
        directory: only what ``submit`` registered there is served.
        """
        import uuid

        from prefect.types.entrypoint import EntrypointType

        from flows._prefect._campaign import campaign_flow

        ours, theirs = tmp_path / "alice", tmp_path / "bob"
        spec = demo_copy(tmp_path, "campaign.toml", **{'name = "demo"': 'name = "e2e-scope"'})
        submitted = await submit_campaign(spec, state_dir=ours)
        by_hand = []
        for home in (ours, theirs):
            deployment = await campaign_flow.ato_deployment(
                name=f"scope-{home.name}-{uuid.uuid4().hex[:8]}",
                parameters={"spec_path": str(spec), "state_dir": str(home)},
                tags=["unattended"],
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
            by_hand.append(await deployment.apply())
        from prefect.client.orchestration import get_client

        async with get_client() as client:
            before = await client.read_deployment(submitted.deployment_id)
        service = CampaignService(query_seconds=0.5, state_dir=ours)
        assert await service.sync_deployments() == 1
        assert service._served == {submitted.deployment_id}
        assert service.runner._deployment_registry.get_deployment_ids() == {submitted.deployment_id}
        assert await service.sync_deployments() == 0
        # Served without writing it again: the submission's deployment is the server's.
        async with get_client() as client:
            after = await client.read_deployment(submitted.deployment_id)
        assert after.updated == before.updated

    async def test_a_deployment_rewritten_on_the_server_still_runs_the_campaign_flow(
        self, prefect_server, tmp_path
    ):
        """Someone holding the secret points the owner's deployment at their own flow.

        The runner serves the deployment as the submission applied it and writes nothing
        back, so it must never take the flow from the server's copy: it runs the campaign
        flow it holds, and the other flow's code never runs.
        """
        from flows._prefect._rest import request
        from flows._prefect._server import client_env

        spec = demo_copy(tmp_path, "campaign.toml", **{'name = "demo"': 'name = "e2e-rewritten"'})
        home = tmp_path / "home"
        submitted = await submit_campaign(spec, state_dir=home)
        marker = tmp_path / "pwned"
        evil = tmp_path / "evil.py"
        evil.write_text(
            "from pathlib import Path\n"
            "from prefect import flow\n\n"
            "@flow\n"
            "def evil(**kwargs):\n"
            f"    Path({str(marker)!r}).write_text('ran')\n"
        )
        request(
            client_env(prefect_server),
            "PATCH",
            f"deployments/{submitted.deployment_id}",
            {"entrypoint": f"{evil}:evil", "path": str(tmp_path)},
        )
        changed = request(
            client_env(prefect_server), "GET", f"deployments/{submitted.deployment_id}"
        )
        assert changed["entrypoint"] == f"{evil}:evil"
        await CampaignService(query_seconds=0.5, state_dir=home).run_once()
        assert await state_of(submitted.flow_run_id) == "COMPLETED"
        assert not marker.exists()
        store = ProvenanceStore.open(home / "campaigns" / "e2e-rewritten")
        try:
            assert store.campaigns()[0]["status"] == "completed"
        finally:
            store.close()

    async def test_two_state_directories_may_use_one_campaign_name(self, prefect_server, tmp_path):
        """Alice's and Bob's "twins" are two campaigns: each runs under its own runner only."""
        spec = demo_copy(tmp_path, "campaign.toml", **{'name = "demo"': 'name = "e2e-twins"'})
        alice, bob = tmp_path / "alice", tmp_path / "bob"
        first = await submit_campaign(spec, state_dir=alice)
        second = await submit_campaign(spec, state_dir=bob)
        assert not second.already_active
        assert second.deployment_id != first.deployment_id
        await CampaignService(query_seconds=0.5, state_dir=alice).run_once()
        assert await state_of(first.flow_run_id) == "COMPLETED"
        assert await state_of(second.flow_run_id) == "SCHEDULED"
        await CampaignService(query_seconds=0.5, state_dir=bob).run_once()
        assert await state_of(second.flow_run_id) == "COMPLETED"
        for home in (alice, bob):
            store = ProvenanceStore.open(home / "campaigns" / "e2e-twins")
            try:
                assert store.campaigns()[0]["status"] == "completed"
            finally:
                store.close()
