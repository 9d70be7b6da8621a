"""Approval deadlines that respect the batch allocation's end, the same on every replay."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flows._engine._approval import ApprovalRequest, approval_deadline
from flows._engine._campaign_state import (
    allocation_end,
    walltime_remaining,
)
from flows._prefect._approval_form import Approval
from flows._spec import ApprovalsSpec
from policies import SpecInvalid

EPOCH_END = 1_800_000_000.0
END = datetime.fromtimestamp(EPOCH_END, UTC)
REQUESTED = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
DEMO = Path(__file__).parents[2] / "examples" / "demo"
LOCAL_SITE = Path(__file__).parents[2] / "site-configs" / "local.toml"


class TestAllocationEnd:
    def test_reads_the_unattended_variable_first(self):
        env = {"UNATTENDED_ALLOCATION_END": str(EPOCH_END), "SLURM_JOB_END_TIME": "1"}
        assert allocation_end(env) == END

    def test_reads_slurms_job_end_time(self):
        assert allocation_end({"SLURM_JOB_END_TIME": str(int(EPOCH_END))}) == END

    def test_an_unparsable_value_is_refused_naming_the_variable(self):
        env = {"UNATTENDED_ALLOCATION_END": "soon", "SLURM_JOB_END_TIME": str(EPOCH_END)}
        with pytest.raises(SpecInvalid, match="UNATTENDED_ALLOCATION_END"):
            allocation_end(env)

    def test_the_site_walltime_counts_from_the_jobs_start(self):
        env = {"SLURM_JOB_START_TIME": str(EPOCH_END - 7200)}
        assert allocation_end(env, walltime_seconds=7200.0) == END

    def test_a_walltime_without_a_start_is_unknown(self):
        assert allocation_end({}, walltime_seconds=7200.0) is None

    def test_nothing_known_is_none(self):
        assert allocation_end({}) is None
        assert walltime_remaining({}) is None

    def test_walltime_remaining_counts_down_to_the_end_and_stops_at_zero(self):
        env = {"UNATTENDED_ALLOCATION_END": str(EPOCH_END)}
        assert walltime_remaining(env, now=EPOCH_END - 90) == pytest.approx(90.0)
        assert walltime_remaining(env, now=EPOCH_END + 90) == 0.0


class TestApprovalDeadline:
    approvals = ApprovalsSpec(timeout_minutes=60, allocation_margin_minutes=15)

    def test_without_an_allocation_end_it_is_the_timeout(self):
        deadline = approval_deadline(REQUESTED, None, self.approvals)
        assert deadline == REQUESTED + timedelta(minutes=60)

    def test_an_allocation_ending_first_bounds_it_by_its_end_minus_the_margin(self):
        end = REQUESTED + timedelta(minutes=40)
        deadline = approval_deadline(REQUESTED, end, self.approvals)
        assert deadline == end - timedelta(minutes=15)

    def test_an_allocation_ending_after_the_timeout_leaves_the_timeout(self):
        end = REQUESTED + timedelta(hours=10)
        deadline = approval_deadline(REQUESTED, end, self.approvals)
        assert deadline == REQUESTED + timedelta(minutes=60)

    def test_an_allocation_already_in_its_margin_times_out_at_once(self):
        end = REQUESTED + timedelta(minutes=5)
        assert approval_deadline(REQUESTED, end, self.approvals) == REQUESTED

    def test_a_naive_requested_at_from_sqlite_is_read_as_utc(self):
        naive = REQUESTED.replace(tzinfo=None)
        assert approval_deadline(naive, None, self.approvals) == REQUESTED + timedelta(minutes=60)

    def test_the_margin_is_bounded_in_the_spec(self):
        with pytest.raises(ValueError, match="allocation_margin_minutes"):
            ApprovalsSpec(allocation_margin_minutes=-1)


class _Suspended(BaseException):
    """Stands for Prefect's suspend: the process leaves the flow here (a BaseException)."""


@dataclass
class Suspensions:
    """A demo campaign's round 2 asking for approval, with every request the engine made."""

    loaded: Any
    state: Path
    requests: list[ApprovalRequest] = field(default_factory=list)

    async def ask(self, env: Mapping[str, str]) -> ApprovalRequest:
        """Run the engine from round 2 (as a resumed run would) until it suspends."""
        from flows._engine._round import CampaignEngine, Hooks
        from flows._engine._store_thread import StoreThread
        from flows._prefect._campaign import open_store
        from tasks import load_site

        async def suspend(request: ApprovalRequest, refused: int) -> Approval:
            self.requests.append(request)
            raise _Suspended

        async def run_batch(index: int, candidates: Any, on_result: Any) -> list[Any]:
            return []  # never reached: round 2 suspends before its batch

        store = open_store(load_site(LOCAL_SITE), self.loaded, self.state)
        store.ensure_campaign(
            self.loaded.spec.name, spec=self.loaded.raw, site="local", seed=7, code_version="t"
        )
        try:
            async with StoreThread(store) as writes:
                engine = CampaignEngine(
                    loaded=self.loaded,
                    store=writes,
                    run_batch=run_batch,
                    node_hours_per_simulation=1.0,
                    hooks=Hooks(suspend=suspend),
                    env=env,
                )
                engine.next_round = 2
                with pytest.raises(_Suspended):
                    await engine.run()
        finally:
            store.close()
        return self.requests[-1]


@pytest.fixture
def suspensions(tmp_path: Path) -> Suspensions:
    from flows._spec import load_campaign

    shutil.copytree(DEMO, tmp_path / "demo")
    spec_path = tmp_path / "demo" / "campaign-approval.toml"
    # The surrogate planner proposes valid batches from the round's seed alone.
    text = spec_path.read_text().replace(
        'kind = "scripted"\ntranscript = "transcript.jsonl"', 'kind = "surrogate"'
    )
    spec_path.write_text(text)
    loaded = load_campaign(spec_path)
    assert loaded.spec.planner.kind == "surrogate"
    return Suspensions(loaded, tmp_path / "state")


class TestEngineRecordsTheAllocationEnd:
    @pytest.mark.asyncio
    async def test_a_replay_elsewhere_computes_the_same_deadline(self, suspensions: Suspensions):
        soon = datetime.now(UTC) + timedelta(minutes=30)
        first = await suspensions.ask({"SLURM_JOB_END_TIME": str(soon.timestamp())})
        replayed = await suspensions.ask({})  # resumed on the login node: no allocation variables
        margin = timedelta(minutes=suspensions.loaded.spec.approvals.allocation_margin_minutes)
        assert first.deadline == replayed.deadline
        assert abs(first.deadline - (soon - margin)) < timedelta(seconds=1)

    @pytest.mark.asyncio
    async def test_the_watchdog_reads_the_same_deadline_as_the_flow(
        self, suspensions: Suspensions, monkeypatch: pytest.MonkeyPatch
    ):
        from prefect.client.schemas.objects import FlowRun
        from prefect.states import Suspended

        from flows._engine._registration import Registration, write_registration
        from flows._prefect._service import pending_approval

        soon = datetime.now(UTC) + timedelta(minutes=30)
        request = await suspensions.ask({"UNATTENDED_ALLOCATION_END": str(soon.timestamp())})
        # The watchdog finds the campaign by the run's deployment in its state directory.
        deployment_id = uuid.uuid4()
        write_registration(
            suspensions.state,
            Registration(
                campaign=suspensions.loaded.spec.name,
                spec_path=str(suspensions.loaded.path),
                site=str(LOCAL_SITE),
                state_dir=str(suspensions.state),
                deployment_id=str(deployment_id),
                deployment_name="run",
            ),
        )
        monkeypatch.setenv("UNATTENDED_HOME", str(suspensions.state))
        flow_run = FlowRun(
            flow_id=uuid.uuid4(),
            name="run",
            deployment_id=deployment_id,
            parameters={},  # never read: anyone holding the secret can write them
            state=Suspended(pause_key=request.pause_key(0)),
        )
        pending = pending_approval(flow_run)
        assert pending.key == request.key
        assert pending.deadline == request.deadline
