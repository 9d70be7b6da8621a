"""A developer's allocation (SLURM_*) or settings (UNATTENDED_*) never reach a test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_test_run_inside_an_allocation_sees_none_of_its_variables():
    env = dict(os.environ)
    env.update(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_END_TIME": "1800000000",
            "UNATTENDED_ALLOCATION_END": "1800000000",
        }
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(Path(__file__).with_name("env_probe.py")),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 passed" in done.stdout
