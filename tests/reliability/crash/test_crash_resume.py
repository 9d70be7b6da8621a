"""SIGKILL the campaign process at every failpoint of a round, restart it, compare the record.

Each case arms one failpoint (``UNATTENDED_FAILPOINTS=point:N``), runs the campaign
with the direct runner until the kill, then runs the same command again. The
finished campaign must equal a run that never crashed: the same attempts (round,
gate call, number, rejected_by, reason, value), decisions, gate calls, batches and
results; the model endpoint asked exactly as often (no recorded answer asked
again); every batch executed once, except the one in flight at the kill.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytestmark = pytest.mark.timeout(120)

N_INFERENCES = 6
BATCH = 4  # the conftest's campaign

# (failpoint, occurrence) -> executions re-run by the restart, per round: only a
# batch killed mid-flight runs again, and only the tasks that had finished before.
CASES: dict[str, dict[int, int]] = {
    "after_fallback_recorded:1": {},
    "after_fallback_recorded:3": {},
    "after_fallback_recorded:4": {},  # the second gate call after the policy's Retry
    "after_answer:1": {},  # round 0's first answer journaled, its checks not yet run
    "after_answer:5": {},  # the answer after the policy's Retry
    "after_attempt_recorded:1": {},  # between round 0's attempts
    "after_attempt_recorded:2": {},  # between round 1's attempts
    "after_gate:1": {},
    "after_gate:2": {},  # after the fallback disposition
    "after_gate:4": {},
    "after_decision_recorded:1": {},
    "after_decision_recorded:3": {},  # the Retry decision
    "after_decision_recorded:4": {},
    "after_batch_launch_recorded:1": {},  # launched, nothing ran yet
    "after_batch_launch_recorded:3": {},
    "mid_batch:2": {0: 2},  # round 0 after 2 of 4 results
    "mid_batch:7": {1: 3},  # round 1 (the fallback batch) after 3 of 4
    "mid_batch:12": {2: 4},  # round 2 after its last result, before they are recorded
    "after_batch:2": {},  # results recorded, checkpoint not yet
    "checkpoint_commit:1": {},  # inside the checkpoint transaction, before COMMIT
    "checkpoint_commit:2": {},
    "checkpoint_commit:3": {},
    "after_checkpoint:2": {},
    "after_checkpoint:3": {},  # after the last round, before 'completed'
}


# Each point (and each batch in flight) keeps a case in the default run; these other
# occurrences of a point already there run with --long.
OTHER_OCCURRENCES = {
    "after_fallback_recorded:1",
    "after_fallback_recorded:3",
    "after_attempt_recorded:1",
    "after_gate:1",
    "after_gate:4",
    "after_decision_recorded:1",
    "after_decision_recorded:4",
    "after_batch_launch_recorded:3",
    "checkpoint_commit:2",
    "checkpoint_commit:3",
    "after_checkpoint:2",
}
DEFAULT_AND_LONG = [
    pytest.param(point, marks=pytest.mark.long) if point in OTHER_OCCURRENCES else point
    for point in CASES
]


def expected_executions(reference: Counter[int], rerun: dict[int, int]) -> Counter[int]:
    expected = Counter(reference)
    expected.update(rerun)
    return expected


class TestReference:
    def test_the_uncrashed_campaign_tells_the_whole_story(self, reference):
        record, inferences, executions = reference
        assert record.status == "completed"
        assert inferences == N_INFERENCES
        assert [(r, c, d) for r, c, d, _, _ in record.gate_calls] == [
            (0, 1, "accepted"),
            (1, 1, "fallback"),
            (2, 1, "accepted"),
            (2, 2, "accepted"),
        ]
        assert [outcome for _, _, outcome in record.decisions] == [
            "continue",
            "continue",
            "retry",
            "continue",
        ]
        assert executions == Counter({0: 4, 1: 4, 2: 4})


class TestCrashAndResume:
    @pytest.mark.parametrize("failpoint", DEFAULT_AND_LONG)
    def test_a_killed_campaign_resumes_to_the_same_record(self, campaign, reference, failpoint):
        record, inferences, executions = reference
        result = campaign.crash_then_finish(failpoint)
        assert result["status"] == "completed"
        resumed = campaign.record()
        assert resumed.attempts == record.attempts
        assert resumed.decisions == record.decisions
        assert resumed.gate_calls == record.gate_calls
        assert resumed.batches == record.batches
        assert resumed.task_results == record.task_results
        assert resumed.rounds == record.rounds  # surrogate and policy states too
        assert campaign.server.requests == inferences
        assert campaign.executions() == expected_executions(executions, CASES[failpoint])

    def test_a_campaign_killed_four_times_in_a_row_still_ends_the_same(self, campaign, reference):
        record, inferences, executions = reference
        chain = (
            "after_attempt_recorded:1",
            "checkpoint_commit:1",
            "mid_batch:3",  # the restart's third result: round 1's third task
            "after_decision_recorded:2",
        )
        result = campaign.crash_then_finish(*chain)
        assert result["status"] == "completed"
        resumed = campaign.record()
        assert resumed.attempts == record.attempts
        assert resumed.decisions == record.decisions
        assert campaign.server.requests == inferences
        assert campaign.executions() == expected_executions(executions, {1: 3})


def _all_points() -> dict[str, dict[int, int]]:
    """Every (failpoint, occurrence) the campaign passes, with its expected re-runs."""
    passes = {
        "after_fallback_recorded": 4,
        "after_attempt_recorded": 2,
        "after_gate": 4,
        "after_decision_recorded": 4,
        "after_batch_launch_recorded": 3,
        "mid_batch": 12,
        "after_batch": 3,
        "checkpoint_commit": 3,
        "after_checkpoint": 3,
    }
    cases: dict[str, dict[int, int]] = {}
    for point, count in passes.items():
        for n in range(1, count + 1):
            rerun = {(n - 1) // BATCH: (n - 1) % BATCH + 1} if point == "mid_batch" else {}
            cases[f"{point}:{n}"] = rerun
    return cases


LONG_CASES = {k: v for k, v in _all_points().items() if k not in CASES}


@pytest.mark.long
class TestEveryCrashPoint:
    @pytest.mark.parametrize("failpoint", list(LONG_CASES))
    def test_a_killed_campaign_resumes_to_the_same_record(self, campaign, reference, failpoint):
        record, inferences, executions = reference
        assert campaign.crash_then_finish(failpoint)["status"] == "completed"
        resumed = campaign.record()
        assert resumed.attempts == record.attempts
        assert resumed.decisions == record.decisions
        assert resumed.batches == record.batches
        assert resumed.task_results == record.task_results
        assert resumed.rounds == record.rounds
        assert campaign.server.requests == inferences
        assert campaign.executions() == expected_executions(executions, LONG_CASES[failpoint])

    def test_a_campaign_killed_after_every_step_once(self, campaign, reference):
        """Kill it at each point's first pass in turn (each restart counts afresh)."""
        record, inferences, _ = reference
        chain = [f"{point}:1" for point in dict.fromkeys(p.split(":")[0] for p in _all_points())]
        assert campaign.crash_then_finish(*chain)["status"] == "completed"
        resumed = campaign.record()
        assert resumed.attempts == record.attempts
        assert resumed.rounds == record.rounds
        assert campaign.server.requests == inferences
