"""A campaign run tells its story in the Prefect UI: artifacts on its run, events on the server.

Real server, real runner, the demo campaigns: what the UI's Artifacts tab lists is
read back through the artifacts API, and the events an automation would match
through the events API.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.client.schemas.sorting import ArtifactSort

from flows._prefect._artifact_views import ROUND_COLUMNS, artifact_key
from flows._prefect._deployment import submit_campaign
from flows._prefect._events import campaign_resource
from flows._prefect._service import CampaignService, approve_run, read_run
from flows._provenance import ProvenanceStore

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "demo"
UI_DOC = (ROOT / "docs" / "ui.md").read_text()


def _copy_demo(folder: Path, spec: str, old: str, new: str) -> Path:
    for item in EXAMPLES.iterdir():
        shutil.copy(item, folder / item.name)
    path = folder / spec
    path.write_text(path.read_text().replace(f'name = "{old}"', f'name = "{new}"'))
    return path


async def _artifacts(flow_run_id: UUID) -> list[Any]:
    """Return every artifact (every version) of the flow run, oldest first."""
    async with get_client() as client:
        newest_first = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])),
            sort=ArtifactSort.CREATED_DESC,
        )
    return list(reversed(newest_first))


def _latest(artifacts: list[Any], key: str) -> Any:
    found = [a for a in artifacts if a.key == key]
    assert found, f"no artifact {key}; keys: {sorted({a.key for a in artifacts})}"
    return found[-1]


async def _events(campaign: str, until: int) -> list[dict[str, Any]]:
    """Return the server's events about ``campaign`` (its resource), oldest first.

    The server stores events in batches (its event persister), so they are read
    until ``until`` of them are there, or 60 s passed.
    """
    body = {
        "filter": {
            "any_resource": {"id": [campaign_resource(campaign)]},
            "event": {"prefix": ["unattended."]},
            "order": "ASC",
        },
        "limit": 50,
    }
    deadline = time.monotonic() + 60
    async with get_client() as client:
        while True:
            response = await client.request("POST", "/events/filter", json=body)
            events = list(response.json()["events"])
            if len(events) >= until or time.monotonic() > deadline:
                return events
            await asyncio.sleep(0.2)


@pytest.mark.integration
@pytest.mark.asyncio
class TestTheDemoRun:
    async def test_leaves_a_round_table_a_batch_progress_and_a_summary(
        self, prefect_server, tmp_path
    ):
        name = "ui-story"
        spec = _copy_demo(tmp_path, "campaign.toml", "demo", name)
        home = tmp_path / "home"
        submitted = await submit_campaign(spec, state_dir=home)
        await CampaignService(query_seconds=0.5, state_dir=home).run_once()
        assert (await read_run(submitted.flow_run_id)).state.type.value == "COMPLETED"
        with ProvenanceStore.open(home / "campaigns" / name) as store:
            best = store.summary(name)["best_result"]["objective"]

        artifacts = await _artifacts(submitted.flow_run_id)
        table = _latest(artifacts, artifact_key(name, "rounds"))
        rows = json.loads(table.data)
        assert [row["round"] for row in rows] == [0, 1, 2, 3]
        assert list(rows[0]) == list(ROUND_COLUMNS)
        assert rows[-1]["best so far"] == pytest.approx(best)
        # Round 1 of the demo falls back after three refused proposals.
        assert rows[1]["gate"] == "fallback after 3 attempts"
        assert all(row["done"] == 8 and row["failed"] == 0 for row in rows)

        progress = [a for a in artifacts if a.key == artifact_key(name, "batch")]
        assert progress
        assert {a.type for a in progress} == {"progress"}
        assert float(progress[-1].data) == 100.0  # the last batch, every task finished

        summary = _latest(artifacts, artifact_key(name, "summary"))
        assert "completed" in summary.data
        assert f"{best:.6g}" in summary.data
        assert f"unattended export {name} --format ro-crate" in summary.data

        kinds = [event["event"] for event in await _events(name, until=1)]
        assert kinds == ["unattended.campaign.completed"]


@pytest.mark.integration
@pytest.mark.asyncio
class TestTheApprovalDemo:
    async def test_shows_the_evidence_while_it_waits_and_the_answer_after(
        self, prefect_server, tmp_path
    ):
        name = "ui-approval"
        spec = _copy_demo(tmp_path, "campaign-approval.toml", "demo-approval", name)
        home = tmp_path / "home"
        submitted = await submit_campaign(spec, state_dir=home)
        service = CampaignService(query_seconds=0.5, state_dir=home)
        await service.run_once()
        run_id = submitted.flow_run_id
        assert (await read_run(run_id)).state.type.value == "PAUSED"

        waiting = await _artifacts(run_id)
        evidence = _latest(waiting, artifact_key(name, "approval")).data
        assert "Round 2 of `ui-approval` waits for approval" in evidence
        assert "**Rule** `" in evidence
        assert "surrogate mean ± std" in evidence
        assert "What the fallback would run instead" in evidence
        assert "**Deadline:**" in evidence
        assert "the campaign stops (`approval_timeout`)" in evidence
        assert f"unattended approve {run_id} --as NAME" in evidence
        rows = _latest(waiting, artifact_key(name, "rounds")).data
        assert json.loads(rows)[2]["policy"] == "suspend: pending"
        requested = await _events(name, until=1)
        assert [e["event"] for e in requested] == ["unattended.approval.requested"]
        assert requested[0]["payload"]["key"] == f"{name}-r2-c1-n0"
        related = {
            r["prefect.resource.id"]: r["prefect.resource.role"] for r in requested[0]["related"]
        }
        assert related[f"prefect.flow-run.{run_id}"] == "flow-run"

        await approve_run(run_id, approver="alice", comment="looks fine")
        await service.run_once()
        assert (await read_run(run_id)).state.type.value == "COMPLETED"
        answered = _latest(await _artifacts(run_id), artifact_key(name, "approval")).data
        assert "answered **approved** by `alice`" in answered
        kinds = [event["event"] for event in await _events(name, until=3)]
        assert kinds == [
            "unattended.approval.requested",
            "unattended.approval.answered",
            "unattended.campaign.completed",
        ]


@pytest.mark.integration
@pytest.mark.asyncio
class TestTheDocumentedAutomation:
    async def test_the_server_takes_the_automation_docs_ui_md_shows(self, prefect_server):
        """The YAML in docs/ui.md, with a real Webhook block, is a valid automation."""
        import yaml
        from prefect.blocks.webhook import Webhook
        from prefect.events.schemas.automations import AutomationCore

        text = re.search(r"```yaml\n(.*?)```", UI_DOC, re.DOTALL).group(1)
        block = await Webhook(url="http://127.0.0.1:9/hook").save("ui-doc-hook", overwrite=True)
        document = yaml.safe_load(text.replace("WEBHOOK_BLOCK_ID", str(block)))
        (automation,) = document["automations"]
        async with get_client() as client:
            made = await client.create_automation(AutomationCore.model_validate(automation))
            stored = await client.read_automation(made)
        assert stored.trigger.expect == {"unattended.approval.requested"}
        assert stored.trigger.match.model_dump()["prefect.resource.id"] == "unattended.campaign.*"
        assert stored.actions[0].block_document_id == block


class TestAFailureNeverReachesTheCampaign:
    def test_a_job_that_raises_is_logged_and_the_next_ones_still_run(self, caplog):
        from flows._prefect._artifacts import _Publisher

        ran: list[str] = []
        publisher = _Publisher()

        def broken(client: Any) -> None:
            raise ConnectionError("server gone")

        publisher.put("rounds", broken)
        publisher.put("summary", lambda client: ran.append("summary"))
        assert publisher.drain(10)
        assert ran == ["summary"]
        assert publisher.failures == 1
        assert "artifact rounds not published: ConnectionError" in caplog.text
        publisher.stop()

    def test_an_event_the_hook_cannot_read_is_logged_not_raised(self, tmp_path, caplog):
        from flows._prefect._artifacts import CampaignArtifacts

        with ProvenanceStore.open(tmp_path) as store:
            artifacts = CampaignArtifacts("c", store, None)
            artifacts.on_event("task", {"round": "not a number", "status": "done"})
        assert "artifacts: event task not handled: ValueError" in caplog.text

    def test_keys_are_lowercase_letters_digits_and_dashes_and_keep_names_apart(self):
        assert artifact_key("demo", "rounds") == "unattended-demo-rounds"
        folded = {artifact_key(name, "rounds") for name in ("Demo_2", "demo-2", "demo.2")}
        assert len(folded) == 3
        assert all(re.fullmatch(r"[a-z0-9-]+", key) for key in folded)


class TestEventsSayWhatTheEngineSaid:
    def test_an_expired_approval_and_a_stopped_campaign_name_their_round_and_code(self):
        from flows._prefect._events import CampaignEvents

        events = CampaignEvents("c", "5f0c")
        suspend = {"round": 2, "key": "c-r2-c1-n0", "rule": "r", "approvers": ["alice"]}
        assert events._event("suspend", suspend)[0] == "unattended.approval.requested"
        name, _, payload = events._event("approval", {"round": 2, "verdict": "timeout"})
        assert (name, payload) == ("unattended.approval.expired", {"round": 2, "key": "c-r2-c1"})
        stop = {"round": 3, "status": "blocked", "code": "budget_exceeded"}
        name, _, payload = events._event("stopped", stop)
        assert name == "unattended.campaign.stopped"
        assert payload == stop
        assert events._event("task", {"round": 3, "status": "done"}) is None
