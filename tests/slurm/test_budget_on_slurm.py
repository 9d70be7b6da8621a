"""The allocation budget is the campaign's on a real Slurm: it holds across crashed runs.

The site's prologue fails (``exit 3``: a ``module load`` on a machine without
modules), so no worker ever starts, and every run of the campaign is SIGKILLed by
a failpoint once its first allocation is requested and its first round has begun
(``after_fallback_recorded``), as a process that dies with its allocation pending
would. Each run is a new process (``python -m flows._cli._direct``): before the
budget was the campaign's, each started counting at zero and asked for another
job every time. With ``max_allocations = 2`` the third run asks for nothing and
stops ``blocked`` with ``budget_exceeded``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from private_slurm import SlurmCluster  # type: ignore[import-not-found]

from tasks import load_site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "demo"
NAME = "budget-crash"


def _campaign(tmp_path: Path) -> Path:
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    spec = tmp_path / "campaign.toml"
    text = spec.read_text()
    assert 'name = "demo"' in text
    spec.write_text(text.replace('name = "demo"', f'name = "{NAME}"'))
    return spec


def _site(tmp_path: Path) -> Path:
    data = load_site("slurm-local", env={}).model_dump(mode="json", exclude_none=True)
    data.pop("secrets", None)
    data["scheduler"].update(
        max_allocations=2, prologue=["echo 'module: command not found' >&2", "exit 3"]
    )
    path = tmp_path / "slurm-site.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


def _run(slurm: SlurmCluster, tmp_path: Path, spec: Path, site: Path, **extra: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    env |= {**slurm.env, **extra}
    argv = [sys.executable, "-m", "flows._cli._direct", str(spec), "--site", str(site)]
    return subprocess.run(
        [*argv, "--state-dir", str(tmp_path / "home")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_crashing_prologue_stops_at_max_allocations_counted_across_restarts(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    spec, site = _campaign(tmp_path), _site(tmp_path)
    for _ in range(2):
        crashed = _run(slurm, tmp_path, spec, site, UNATTENDED_FAILPOINTS="after_fallback_recorded")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]

    stopped = _run(slurm, tmp_path, spec, site)
    result = json.loads(stopped.stdout.strip().splitlines()[-1])
    assert (result["status"], result["error_code"]) == ("blocked", "budget_exceeded"), result
    assert "2 of scheduler.max_allocations=2" in result["message"]

    database = tmp_path / "home" / "campaigns" / NAME / "provenance.db"
    with sqlite3.connect(database) as connection:
        jobs = connection.execute(
            "SELECT request, job_id FROM allocation ORDER BY request"
        ).fetchall()
        status = connection.execute("SELECT status, error_code FROM campaign").fetchone()
    assert [request for request, _ in jobs] == [1, 2]  # numbered for the campaign
    assert len({job for _, job in jobs}) == 2  # two sbatch in all, none by the third run
    assert status == ("blocked", "budget_exceeded")
