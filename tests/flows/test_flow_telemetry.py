"""The campaign flow under a real Prefect server ships one trace per run to an OTLP receiver."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flows._prefect._deployment import submit_campaign
from flows._prefect._service import CampaignService, read_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class FlowTelemetry:
    """What one demo flow run sent to the receiver, and how the run ended."""

    spans: list[Any]
    logs: list[Any]
    state: str


async def _ship(tmp_path: Path) -> FlowTelemetry:
    sys.path.insert(0, str(ROOT / "tests" / "telemetry"))
    try:
        from otlp_receiver import serving_receiver, site_with_endpoint
    finally:
        sys.path.pop(0)
    for item in (ROOT / "examples" / "demo").iterdir():
        shutil.copy(item, tmp_path / item.name)
    spec = tmp_path / "campaign.toml"
    spec.write_text(spec.read_text().replace('name = "demo"', 'name = "flow-telemetry"'))
    with serving_receiver() as receiver:
        site = site_with_endpoint(tmp_path, receiver.endpoint)
        submitted = await submit_campaign(spec, site=str(site), state_dir=tmp_path / "home")
        await CampaignService(
            query_seconds=0.5, state_dir=tmp_path / "home"
        ).run_once()  # the flow runs in a subprocess
    flow_run = await read_run(submitted.flow_run_id)
    state = flow_run.state.type.value if flow_run.state else "?"
    return FlowTelemetry(list(receiver.spans), list(receiver.logs), state)


@pytest.fixture(scope="module")
def shipped(prefect_server: Any, tmp_path_factory: pytest.TempPathFactory) -> FlowTelemetry:
    """Run the demo campaign once through the flow (about 30 s); share what arrived."""
    return asyncio.run(_ship(tmp_path_factory.mktemp("flow-telemetry")))


class TestFlowTelemetry:
    def test_the_run_completes_and_its_spans_share_one_trace(self, shipped: FlowTelemetry):
        assert shipped.state == "COMPLETED"
        names = Counter(span.name for span in shipped.spans)
        assert names["campaign flow-telemetry"] == 1
        assert all(names[f"round {i}"] == 1 for i in range(4))
        assert names["accept planner"] == 4
        assert len({span.trace_id for span in shipped.spans}) == 1

    def test_evaluation_records_are_in_the_runs_trace(self, shipped: FlowTelemetry):
        evaluations = [log for log in shipped.logs if log.event_name == "gen_ai.evaluation.result"]
        assert evaluations
        assert {log.trace_id for log in evaluations} == {shipped.spans[0].trace_id}

    def test_prefect_task_spans_nest_under_their_round_and_hold_the_gate(
        self, shipped: FlowTelemetry
    ):
        by_id = {span.span_id: span for span in shipped.spans}
        (campaign,) = [s for s in shipped.spans if s.name == "campaign flow-telemetry"]
        assert campaign.parent_span_id == ""  # the SDK is installed inside the flow body
        for gate in (s for s in shipped.spans if s.name == "accept planner"):
            step = by_id[gate.parent_span_id]
            assert step.name.startswith("gate round ")  # the Prefect task that runs the gate
            assert by_id[step.parent_span_id].name == f"round {step.name.split()[2]}"
