"""Slurm is asked about the site before anything runs, and its refusals are told as its own.

``unattended check`` (and so ``submit`` and ``run``) asks the private Slurm whether
the site's partition exists (``sinfo``) and whether a job of the site's shape would
be accepted (``sbatch --test-only``), naming the field. A refusal that still comes
at run time (the check ran elsewhere) is a ``site_invalid`` error carrying
Slurm's own words, not a raw dask-jobqueue error ending the campaign ``internal``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from private_slurm import SlurmCluster, slurm_local_site  # type: ignore[import-not-found]
from test_campaign_on_slurm import campaign, site_file  # type: ignore[import-not-found]

from policies import SiteInvalid
from tasks import AllocationExecutor, slurm_site_problems

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def check(slurm: SlurmCluster, tmp_path: Path, site: Path) -> subprocess.CompletedProcess[str]:
    spec, _ = campaign(tmp_path, "site-check", rounds=1, batch_size=2, seconds=0.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    env |= slurm.env | {"UNATTENDED_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "flows._cli", "check", str(spec), "--site", str(site)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_refuses_a_partition_slurm_does_not_have_naming_the_field(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    done = check(slurm, tmp_path, site_file(tmp_path, queue="nope"))
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "field 'scheduler.partition': Slurm has no partition 'nope' (sinfo lists: debug)" in said


def test_check_passes_the_site_slurm_accepts(slurm: SlurmCluster, tmp_path: Path) -> None:
    done = check(slurm, tmp_path, site_file(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_job_shape_slurm_cannot_run_is_refused_by_sbatch_test_only(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """More memory than any node has: only the controller can say it (``--test-only``)."""
    site = slurm_local_site(backend__jobqueue__memory="100000GB")
    problems = slurm_site_problems(site, slurm.env)
    assert [field for field, _ in problems] == ["backend.jobqueue"], problems
    assert "sbatch --test-only refuses the site's job" in problems[0][1]
    assert "Requested node configuration is not available" in problems[0][1]
    assert slurm.job_ids() == []  # asked, not submitted


@pytest.mark.asyncio
async def test_at_run_time_an_sbatch_refusal_is_a_site_error_in_slurms_words(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    site = slurm_local_site(scheduler__queue="nope")
    with pytest.raises(SiteInvalid) as raised:
        async with AllocationExecutor.from_site(site, work_dir=str(tmp_path)):
            pass
    assert raised.value.code == "site_invalid"
    assert raised.value.details["field"] == "scheduler.partition"
    assert "Slurm refused the allocation's job: sbatch: error: invalid partition" in str(
        raised.value
    )
