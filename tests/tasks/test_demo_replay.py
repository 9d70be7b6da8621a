"""The shipped demo replay runs end to end with the real objective executable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class TestDemoReplay:
    def test_replay_prints_every_rejection_the_fallback_and_a_good_result(self) -> None:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "demo" / "replay.py")],
            capture_output=True,
            text=True,
            timeout=110,
            cwd=ROOT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        rounds = [
            line.split(",")[0]
            for line in lines
            if line.startswith("round") and ":" in line and "attempt" not in line
        ]
        assert rounds == [
            "round 1: accepted",
            "round 2: fallback",
            "round 3: accepted",
            "round 4: accepted",
        ]
        rejected = [line.split(":")[1].strip() for line in lines if "rejected by" in line]
        assert rejected == [
            "rejected by finite",
            "rejected by within_bounds",
            "rejected by batch_size",
            "rejected by refusal",
            "rejected by truncation",
        ]
        best = float(lines[-1].rsplit("->", 1)[1])
        assert best < 0.01
