"""Terminal progress, read from a real provenance database the way ``follow`` reads it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from acceptance import Attempt
from flows._cli._progress import CampaignProgress, RoundProgress, progress_lines, read_progress
from flows._provenance import ProvenanceStore
from tasks import TaskResult

CAMPAIGN = "progress"


def attempt(number: int, rejected_by: str | None = None) -> Attempt[dict[str, object]]:
    return Attempt(
        number=number,
        value={"candidates": [[0.1 * number]]},
        rejected_by=rejected_by,
        reason="not finite" if rejected_by else None,
        scores={},
        verdicts=(),
        duration=0.0,
    )


def result(index: int, status: str) -> TaskResult:
    return TaskResult(
        index=index,
        key=f"k{index}",
        status=status,  # type: ignore[arg-type]  # a literal from the test's table
        value={"value": 1.0} if status == "done" else None,
        runtime=0.1,
        host="localhost",
        attempts=1,
    )


def gate(store: ProvenanceStore, index: int, disposition: str, rejected: int) -> None:
    gate_id = store.record_gate_call(
        CAMPAIGN, index, 1, gate="planner", budget=3, fallback_hash="h", fallback_value=[[0.5]]
    )
    attempts = [attempt(n, "finite") for n in range(1, rejected + 1)]
    if disposition == "accepted":
        attempts.append(attempt(rejected + 1))
    store.record_attempts(gate_id, attempts)
    store.finish_gate_call(gate_id, disposition, len(attempts))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProvenanceStore]:
    """A campaign three rounds in: one done, one batch in flight, one waiting for approval."""
    writer = ProvenanceStore.open(tmp_path)
    writer.ensure_campaign(CAMPAIGN, spec={}, site="local", seed=1, code_version="test")
    # Round 0: accepted after one rejection, 3 tasks, one of them failed.
    writer.start_round(CAMPAIGN, 0)
    gate(writer, 0, "accepted", rejected=1)
    writer.record_decision(CAMPAIGN, 0, 1, {"outcome": "continue"})
    writer.record_batch_launched(
        "b0", campaign=CAMPAIGN, round_index=0, candidates=[[0.1], [0.2], [0.3]], backend="local"
    )
    writer.record_batch_results("b0", [result(0, "done"), result(1, "failed"), result(2, "done")])
    writer.checkpoint_round(
        CAMPAIGN, 0, surrogate_state={}, policy_state={}, planner_state={}, status="completed"
    )
    # Round 1: every attempt failed, the fallback's 4 tasks are running.
    writer.start_round(CAMPAIGN, 1)
    gate(writer, 1, "fallback", rejected=3)
    writer.record_decision(CAMPAIGN, 1, 2, {"outcome": "continue"})
    writer.record_batch_launched(
        "b1", campaign=CAMPAIGN, round_index=1, candidates=[[0.4]] * 4, backend="local"
    )
    writer.close()
    reader = ProvenanceStore.open(tmp_path, read_only=True)
    yield reader
    reader.close()


@pytest.fixture
def waiting(tmp_path: Path, store: ProvenanceStore) -> ProvenanceStore:
    """The same campaign with round 1 settled and round 2 waiting for an approval."""
    writer = ProvenanceStore.open(tmp_path)
    writer.record_batch_results("b1", [result(i, "done") for i in range(4)])
    writer.checkpoint_round(
        CAMPAIGN, 1, surrogate_state={}, policy_state={}, planner_state={}, status="completed"
    )
    writer.start_round(CAMPAIGN, 2)
    gate(writer, 2, "accepted", rejected=0)
    writer.record_decision(CAMPAIGN, 2, 3, {"outcome": "suspend"})
    writer.record_approval_request(
        CAMPAIGN,
        2,
        key="progress-r2-c1",
        rule="review-round-2",
        approvers=["alice"],
        description=None,
        flow_run_id=None,
    )
    writer.close()
    return store


class TestReadProgress:
    def test_a_finished_batch_counts_done_and_failed_tasks(self, store: ProvenanceStore):
        first = read_progress(store, CAMPAIGN)[0]
        assert (first.gate, first.attempts, first.decision) == ("accepted", 2, "continue")
        assert (first.tasks, first.done, first.failed, first.finished) == (3, 2, 1, True)
        assert first.status == "completed"

    def test_a_batch_in_flight_shows_its_size_before_any_result(self, store: ProvenanceStore):
        second = read_progress(store, CAMPAIGN)[1]
        assert (second.gate, second.attempts) == ("fallback", 3)
        assert (second.tasks, second.done, second.failed, second.finished) == (4, 0, 0, False)

    def test_an_unanswered_approval_names_its_rule(self, waiting: ProvenanceStore):
        third = read_progress(waiting, CAMPAIGN)[2]
        assert third.waiting_for == "review-round-2"
        assert third.tasks == 0


class TestPlainLines:
    def test_each_milestone_is_printed_once_in_order(self, store: ProvenanceStore):
        out = io.StringIO()
        with CampaignProgress(live=False, stream=out) as progress:
            progress.update(read_progress(store, CAMPAIGN))
            progress.update(read_progress(store, CAMPAIGN))  # nothing new: nothing printed
        assert out.getvalue().splitlines() == [
            "round 0: started",
            "round 0: gate accepted after 2 attempt(s)",
            "round 0: policy continue",
            "round 0: batch of 3 task(s) launched",
            "round 0: batch finished: 2 done, 1 failed",
            "round 0: completed; best so far 1",
            "round 1: started",
            "round 1: gate fallback after 3 attempt(s)",
            "round 1: policy continue",
            "round 1: batch of 4 task(s) launched",
        ]

    def test_progress_made_later_is_printed_as_it_appears(
        self, store: ProvenanceStore, waiting: ProvenanceStore
    ):
        out = io.StringIO()
        progress = CampaignProgress(live=False, stream=out)
        progress.update(read_progress(store, CAMPAIGN)[:1])
        before = len(out.getvalue().splitlines())
        progress.update(read_progress(waiting, CAMPAIGN))
        new = out.getvalue().splitlines()[before:]
        assert "round 1: batch finished: 4 done, 0 failed" in new
        assert "round 2: waiting for approval by alice (rule review-round-2)" in new

    def test_who_answered_an_approval_is_printed_once(
        self, tmp_path: Path, waiting: ProvenanceStore
    ):
        writer = ProvenanceStore.open(tmp_path)
        writer.record_approval_event(
            "progress-r2-c1", decided_by="mallory", decision="not_allowed", allowed=False
        )
        writer.record_approval_event(
            "progress-r2-c1", decided_by="alice", decision="approved", allowed=True
        )
        writer.close()
        third = read_progress(waiting, CAMPAIGN)[2]
        assert third.waiting_for is None
        assert third.answered == "approved by alice"
        out = io.StringIO()
        CampaignProgress(live=False, stream=out).update(read_progress(waiting, CAMPAIGN))
        lines = out.getvalue().splitlines()
        assert [line for line in lines if "approval" in line] == [
            f"round 2: approval {third.answered}"
        ]

    def test_the_best_so_far_carries_over_rounds_without_results(self, waiting: ProvenanceStore):
        rounds = read_progress(waiting, CAMPAIGN)
        assert [r.best for r in rounds] == [1.0, 1.0, 1.0]

    def test_a_pending_gate_call_is_not_reported_as_done(self):
        round_ = RoundProgress(0, "running", 1, "pending", 1, None, 0, 0, 0, False, None)
        assert progress_lines(round_) == ["round 0: started"]


class TestLiveTable:
    def test_renders_a_row_per_round_with_the_task_counts(self, store: ProvenanceStore):
        out = io.StringIO()
        with CampaignProgress(live=True, stream=out) as progress:
            progress.update(read_progress(store, CAMPAIGN))
        text = out.getvalue()
        assert "2 done, 1 failed" in text
        assert "4 running" in text
        assert "tasks: 2 done, 1 failed" in text


def _registered_run(home: Path, spec: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Register campaign demo in ``home`` and return a run of its deployment."""
    from flows._engine._registration import Registration, write_registration

    write_registration(
        home,
        Registration(
            campaign="demo",
            spec_path=str(spec),
            site="local",
            state_dir=str(home),
            deployment_id="d-1",
            deployment_name="demo",
        ),
    )
    monkeypatch.setenv("UNATTENDED_HOME", str(home))
    # A run's own parameters point elsewhere: they are never read.
    return SimpleNamespace(deployment_id="d-1", parameters={"spec_path": "/nowhere.toml"})


class TestPoll:
    def test_reads_the_database_the_campaign_s_registration_points_at(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ):
        """The run's deployment, looked up in this state directory; never its parameters."""
        spec = Path(__file__).parents[2] / "examples" / "demo" / "campaign.toml"
        writer = ProvenanceStore.open(tmp_path / "campaigns" / "demo")
        writer.ensure_campaign("demo", spec={}, site="local", seed=7, code_version="test")
        writer.start_round("demo", 0)
        writer.close()
        monkeypatch.chdir(Path(__file__).parents[2])  # the "local" site is found from here
        flow_run = _registered_run(tmp_path, spec, monkeypatch)
        out = io.StringIO()
        with CampaignProgress(live=False, stream=out) as progress:
            progress.poll(flow_run)
        assert out.getvalue().splitlines() == ["round 0: started"]

    def test_a_database_that_does_not_exist_yet_shows_nothing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ):
        spec = Path(__file__).parents[2] / "examples" / "demo" / "campaign.toml"
        monkeypatch.chdir(Path(__file__).parents[2])
        flow_run = _registered_run(tmp_path, spec, monkeypatch)
        out = io.StringIO()
        with CampaignProgress(live=False, stream=out) as progress:
            progress.poll(flow_run)
        assert out.getvalue() == ""
        assert not (tmp_path / "campaigns" / "demo" / "provenance.db").exists()


class TestFollowingALiveDatabase:
    def test_a_database_opened_before_its_run_started_shows_the_run_s_rounds(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Submit makes the database; the follower opens it before the run writes (no -wal).

        Opened then, SQLite reads it as immutable: the follower must open it again, or a
        cold-start 'unattended run' shows no round at all (it did).
        """
        from flows._cli import _progress
        from flows._provenance._sqlite import open_read_only

        writer = ProvenanceStore.open(tmp_path)
        writer.ensure_campaign(CAMPAIGN, spec={}, site="local", seed=1, code_version="test")
        writer.close()
        assert not (tmp_path / "provenance.db-wal").exists()
        monkeypatch.setattr(
            _progress, "open_progress_store", lambda _run: (open_read_only(tmp_path), CAMPAIGN)
        )
        out = io.StringIO()
        with CampaignProgress(live=False, stream=out) as progress:
            progress.poll(None)
            assert out.getvalue() == ""
            writer = ProvenanceStore.open(tmp_path)
            try:
                writer.start_round(CAMPAIGN, 0)
                progress.poll(None)
            finally:
                writer.close()
        assert out.getvalue().splitlines() == ["round 0: started"]
