"""A planner that raises (its endpoint failed, its transcript ran out) leaves its attempt.

The gate hands the attempt the producer failed to the round, which records it
(``failed_by`` ``producer``, no value, the error as its reason) and ends the gate
call ``failed``; the campaign stops with the error's code and ``inspect --round N``
shows which attempt failed and why. (A rerun checks again what failed, as
``test_simulation_faults`` shows for a crashed verifier: the same record path.)
"""

from __future__ import annotations

import json

import pytest

from flows._cli import main
from flows._engine._direct import run_direct

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

ANSWER = {"rationale": "spread", "candidates": [[0.1, 0.2], [0.4, 0.4], [0.6, 0.3], [0.8, 0.9]]}


def scripted(campaign, answers: int):
    """Write a 2-round fault campaign planned by a transcript of ``answers`` answers."""
    spec = campaign.write({})
    transcript = campaign.folder / "transcript.jsonl"
    transcript.write_text("".join(json.dumps({"answer": ANSWER}) + "\n" for _ in range(answers)))
    text = spec.read_text().replace(
        'kind = "surrogate"', 'kind = "scripted"\ntranscript = "transcript.jsonl"'
    )
    spec.write_text(text)
    return spec


async def test_a_planner_that_raises_leaves_a_failed_attempt_and_a_failed_gate_call(
    fault_campaign, capsys
):
    campaign = fault_campaign()
    spec = scripted(campaign, answers=1)  # round 1 asks for a second answer: none is left

    result = await run_direct(spec, state_dir=campaign.home, env={})

    assert (result.status, result.error_code) == ("failed", "provider_error")
    assert campaign.rows(
        "SELECT round_index, disposition, attempts_used FROM gate_call ORDER BY round_index"
    ) == [(0, "accepted", 1), (1, "failed", 1)]
    [(number, value, rejected_by, failed_by, reason)] = campaign.rows(
        "SELECT a.number, a.value, a.rejected_by, a.failed_by, a.reason FROM attempt a "
        "JOIN gate_call g ON a.gate_call_id = g.id WHERE g.round_index = 1"
    )
    assert (number, value, rejected_by, failed_by) == (1, "null", None, "producer")
    assert reason.startswith("ProviderError: ")
    assert campaign.rows("SELECT count(*) FROM batch WHERE round_index = 1") == [(0,)]

    capsys.readouterr()
    database = str(campaign.database)
    assert main(["inspect", campaign.name, "--round", "1", "--db", database]) == 0
    shown = capsys.readouterr().out
    assert "failed (producer failed) after 1 of 2 attempts" in shown
    # The reason is wrapped to the terminal's width (100 columns): compare without spacing.
    assert "".join(f"Attempt 1 failed in producer: {reason}".split()) in "".join(shown.split())
    assert "task -" not in shown  # no task ran: no task line
