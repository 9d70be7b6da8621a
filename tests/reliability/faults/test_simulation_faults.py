"""Simulations that crash, hang or fail on the allocation: recorded as what they are.

A failed simulation is a task result with its status, stable code, exit code and
stderr tail, never a rejection; the campaign goes on unless its policy says
otherwise, and a policy can read how many tasks of the last batch failed.
"""

from __future__ import annotations

import json
import signal

import pytest

from flows._cli import main
from flows._engine._direct import run_direct

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

FAILURE_STOP = """\
[policy]
name = "failures"

[[rules]]
name = "too-many-failures"
description = "More than half of the last batch failed."
advice = "Look at the failed tasks' stderr before spending more."
severity = "HARD_STOP"
when = "history.failed_last_batch > 2"
"""


class TestSimulationFaults:
    async def test_a_simulation_killed_by_sigsegv_is_a_failed_task_and_the_campaign_goes_on(
        self, fault_campaign
    ):
        campaign = fault_campaign()
        spec = campaign.write({"0:1": "segv"})
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert result.status == "completed"
        results = campaign.task_results()
        crashed = results[(0, 1)]
        assert (crashed["status"], crashed["error_code"], crashed["exit_code"]) == (
            "failed",
            "task_failed",
            -signal.SIGSEGV,
        )
        others = [r["status"] for key, r in results.items() if key != (0, 1)]
        assert others == ["done"] * 7

    async def test_a_simulation_past_its_timeout_is_a_timeout_record(self, fault_campaign):
        campaign = fault_campaign()
        spec = campaign.write({"1:2": "hang"}, task_timeout=1.0)
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert result.status == "completed"
        hung = campaign.task_results()[(1, 2)]
        assert (hung["status"], hung["error_code"]) == ("timeout", "deadline_exceeded")

    async def test_a_nonzero_exit_keeps_its_exit_code_and_stderr_tail(self, fault_campaign):
        campaign = fault_campaign()
        spec = campaign.write({"0:3": "exit"})
        await run_direct(spec, state_dir=campaign.home, env={})
        failed = campaign.task_results()[(0, 3)]
        assert (failed["status"], failed["error_code"], failed["exit_code"]) == (
            "failed",
            "task_failed",
            3,
        )
        assert "mesh did not converge" in failed["stderr_tail"]


class TestFailurePolicy:
    async def test_a_rule_on_failed_tasks_stops_the_campaign_after_a_bad_batch(
        self, fault_campaign
    ):
        campaign = fault_campaign()
        plan = {"0:0": "exit", "0:1": "segv", "0:2": "exit"}
        spec = campaign.write(plan, rounds=3, policy=FAILURE_STOP)
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert (result.status, result.error_code, result.rounds_completed) == (
            "blocked",
            "policy_denied",
            1,
        )
        assert campaign.campaign_row() == ("blocked", "policy_denied")
        # Round 1's proposal was judged and refused; its batch never ran.
        assert campaign.rows("SELECT round_index, outcome FROM policy_decision") == [
            (0, "continue"),
            (1, "block"),
        ]
        assert {r for r, _ in campaign.task_results()} == {0}

    async def test_the_same_rule_lets_a_batch_with_few_failures_through(self, fault_campaign):
        campaign = fault_campaign()
        spec = campaign.write({"0:0": "exit", "0:1": "exit"}, rounds=3, policy=FAILURE_STOP)
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert result.status == "completed"


async def crash_the_verifier(campaign):
    """Run a campaign whose verifier prints a line to stderr and exits 3; return its spec."""
    spec = campaign.write({"verifier": "exit"}, verifier_limit=100.0)
    result = await run_direct(spec, state_dir=campaign.home, env={})
    assert (result.status, result.error_code) == ("failed", "verifier_failed")
    return spec


class TestVerifierFailure:
    async def test_a_verifier_that_fails_ends_the_run_failed_not_rejected(self, fault_campaign):
        campaign = fault_campaign()
        spec = campaign.write({"verifier": "exit"}, verifier_limit=100.0)
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert (result.status, result.error_code) == ("failed", "verifier_failed")
        assert campaign.campaign_row() == ("failed", "verifier_failed")
        # A failure, not a rejection: no attempt was recorded as rejected, no batch ran.
        assert campaign.rows("SELECT rejected_by FROM attempt WHERE rejected_by IS NOT NULL") == []
        assert campaign.rows("SELECT count(*) FROM batch") == [(0,)]

    async def test_the_attempt_a_crashed_verifier_ended_is_recorded_as_failed(self, fault_campaign):
        campaign = fault_campaign()
        await crash_the_verifier(campaign)
        assert campaign.rows("SELECT disposition, attempts_used FROM gate_call") == [("failed", 1)]
        [(number, rejected_by, failed_by, reason, verdicts)] = campaign.rows(
            "SELECT number, rejected_by, failed_by, reason, verdicts FROM attempt"
        )
        assert (number, rejected_by, failed_by) == (1, None, "verifier")
        assert "verifier 'verifier'" in reason
        failing = json.loads(verdicts)[-1]
        assert (failing["check"], failing["passed"]) == ("verifier", False)
        details = failing["details"]
        assert (details["status"], details["error_code"], details["exit_code"]) == (
            "failed",
            "task_failed",
            3,
        )
        assert "verifier gave up: mesh did not converge" in details["stderr_tail"]

    async def test_a_rerun_with_the_verifier_fixed_checks_that_attempt_again(self, fault_campaign):
        campaign = fault_campaign()
        spec = await crash_the_verifier(campaign)
        (campaign.folder / "plan.json").write_text(json.dumps({}))
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert result.status == "completed"
        # What the new check said replaced the failure: no attempt is left failed.
        assert campaign.rows(
            "SELECT g.round_index, g.disposition, a.number, a.rejected_by, a.failed_by "
            "FROM gate_call g JOIN attempt a ON a.gate_call_id = g.id WHERE g.round_index = 0"
        ) == [(0, "accepted", 1, None, None)]

    async def test_inspect_round_shows_the_crashed_verifier_with_its_exit_and_stderr(
        self, fault_campaign, capsys
    ):
        campaign = fault_campaign()
        await crash_the_verifier(campaign)
        database = str(campaign.database)
        capsys.readouterr()
        assert main(["inspect", campaign.name, "--round", "0", "--db", database]) == 0
        shown = capsys.readouterr().out
        assert "failed (verifier failed) after 1 of 2 attempts" in shown
        assert "failed in verifier" in shown
        assert "status failed, error task_failed, exit code 3" in shown
        assert "verifier gave up: mesh did not converge" in shown
        assert "rejected by" not in shown

        assert main(["inspect", campaign.name, "--round", "0", "--json", "--db", database]) == 0
        [call] = json.loads(capsys.readouterr().out)["gate_calls"]
        [attempt] = call["attempts"]
        assert (attempt["failed_by"], attempt["rejected_by"]) == ("verifier", None)
        details = attempt["verdicts"][-1]["details"]
        assert details["exit_code"] == 3
        assert "verifier gave up: mesh did not converge" in details["stderr_tail"]

    async def test_export_keeps_the_crashed_verifier_attempt_not_accepted(
        self, fault_campaign, capsys
    ):
        campaign = fault_campaign()
        await crash_the_verifier(campaign)
        database = str(campaign.database)
        capsys.readouterr()
        assert main(["export", campaign.name, "--format", "jsonl", "--db", database]) == 0
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        [attempt] = [r for r in records if r["kind"] == "attempt"]
        assert (attempt["accepted"], attempt["failed_by"], attempt["rejected_by"]) == (
            False,
            "verifier",
            None,
        )
        assert "mesh did not converge" in attempt["verdicts"][-1]["details"]["stderr_tail"]
