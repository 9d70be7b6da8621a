"""A simulation that runs to its end but writes no value is a failed task, ``bad_output``.

Before, stdout that was not JSON became ``value = None`` with status ``done``: a
simulation printing ``hi`` gave "8 done, 0 failed" and a Completed campaign. Now the
task is failed with a stable code and both streams' tails kept, the policies count it
(``history.failed_last_batch``), and a campaign none of whose simulations produced a
value ends ``failed``.
"""

from __future__ import annotations

import pytest

from flows._engine._direct import run_direct

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

FAILURE_STOP = """\
[policy]
name = "failures"

[[rules]]
name = "whole-batch-failed"
description = "Every task of the last batch failed."
advice = "Read the failed tasks' stdout and stderr before spending more."
severity = "HARD_STOP"
when = "history.failed_last_batch >= 4"
"""


class TestBadOutput:
    async def test_text_on_stdout_is_a_failed_task_with_both_tails_kept(self, fault_campaign):
        campaign = fault_campaign()
        spec = campaign.write({"0:1": "text"}, rounds=1)
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert result.status == "completed"  # the other three produced values
        results = campaign.task_results()
        bad = results[(0, 1)]
        assert (bad["status"], bad["error_code"], bad["exit_code"]) == ("failed", "bad_output", 0)
        assert "stdout is not JSON" in bad["stderr_tail"]
        assert "--- stdout" in bad["stderr_tail"]
        assert "\nhi\n" in bad["stderr_tail"]
        assert "mesh written to out.vtk" in bad["stderr_tail"]  # stderr, kept beside it
        assert [r["status"] for k, r in results.items() if k != (0, 1)] == ["done"] * 3
        [(value, objective)] = campaign.rows(
            "SELECT t.value, t.objective FROM task_result t JOIN batch b ON t.batch_id = b.id "
            "WHERE b.round_index = 0 AND t.task_index = 1"
        )
        assert (value, objective) == ("null", None)  # JSON null: no value, no objective

    @pytest.mark.parametrize(("fault", "shown"), [("nan", "NaN"), ("novalue", '"result": 1.0')])
    async def test_json_without_a_finite_objective_is_bad_output(
        self, fault_campaign, fault, shown
    ):
        campaign = fault_campaign()
        spec = campaign.write({"0:2": fault}, rounds=1)
        await run_direct(spec, state_dir=campaign.home, env={})
        bad = campaign.task_results()[(0, 2)]
        assert (bad["status"], bad["error_code"]) == ("failed", "bad_output")
        assert shown in bad["stderr_tail"]

    async def test_a_campaign_whose_simulations_never_produced_a_value_ends_failed(
        self, fault_campaign
    ):
        campaign = fault_campaign()
        spec = campaign.write({"*": "text"}, rounds=2)
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert (result.status, result.error_code) == ("failed", "bad_output")
        assert "no simulation produced a value" in result.message
        assert campaign.campaign_row() == ("failed", "bad_output")
        statuses = {(r["status"], r["error_code"]) for r in campaign.task_results().values()}
        assert statuses == {("failed", "bad_output")}
        assert len(campaign.task_results()) == 8

    async def test_a_policy_sees_a_whole_batch_of_bad_output_as_failed(self, fault_campaign):
        campaign = fault_campaign()
        spec = campaign.write({"*": "text"}, rounds=3, policy=FAILURE_STOP)
        result = await run_direct(spec, state_dir=campaign.home, env={})
        assert (result.status, result.error_code, result.rounds_completed) == (
            "blocked",
            "policy_denied",
            1,
        )
        assert campaign.rows("SELECT round_index, outcome FROM policy_decision") == [
            (0, "continue"),
            (1, "block"),
        ]
