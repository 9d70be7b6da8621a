"""Replay the demo transcript: four rounds of gate, fallback and real evaluations.

Run from the repository root::

    python examples/demo/replay.py [examples/demo/transcript.jsonl]

Each round builds the deterministic fallback first, asks the scripted planner
through the accept gate (3 attempts, the cheap planner checks), evaluates the
batch with the demo objective as a real executable (one process per
candidate), and feeds the results to the surrogate. It prints one line per
attempt and per round, then the best candidate found.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from acceptance import accept
from tasks import Bounds, GaussianProcess, ScriptedPlanner, fallback_batch, planner_checks

HERE = Path(__file__).resolve().parent
BOUNDS = Bounds.unit(2)
COUNT = 8
ROUNDS = 4
ATTEMPTS = 3


def evaluate(candidate: list[float]) -> float:
    """Run ``python -m tasks.demo.objective`` on one candidate and return its value."""
    done = subprocess.run(
        [sys.executable, "-m", "tasks.demo.objective", "--fidelity", "high"],
        input=json.dumps({"x": candidate}),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return float(json.loads(done.stdout)["value"])


async def replay(transcript: Path) -> int:
    """Run the demo campaign against ``transcript`` and print what happened."""
    planner = ScriptedPlanner(transcript)
    surrogate = GaussianProcess()
    for number in range(1, ROUNDS + 1):
        fallback = fallback_batch(surrogate, BOUNDS, COUNT, seed=number)
        outcome = await accept(
            planner,
            checks=planner_checks(BOUNDS, COUNT),
            attempts=ATTEMPTS,
            fallback=fallback.to_proposal,
            name="planner",
        )
        for attempt in outcome.attempts:
            verdict = (
                f"rejected by {attempt.rejected_by}: {attempt.reason}"
                if attempt.rejected_by
                else "accepted"
            )
            print(f"round {number} attempt {attempt.number}: {verdict}")
        batch = outcome.value.candidates
        values = [evaluate(candidate) for candidate in batch]
        surrogate.assimilate(batch, values)
        print(
            f"round {number}: {outcome.disposition}, fallback sha256 {fallback.content_hash[:12]}, "
            f"best value {min(values):.4f}, transcript position {planner.position}"
        )
    state = surrogate.to_state()
    best = min(range(len(state["values"])), key=state["values"].__getitem__)
    print(f"best: {state['points'][best]} -> {state['values'][best]:.4f}")
    return 0


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "transcript.jsonl"
    sys.exit(asyncio.run(replay(path)))
