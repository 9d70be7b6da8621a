"""The private Slurm the tests start, and what tasks._slurm reads from it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from private_slurm import SlurmCluster  # type: ignore[import-not-found]

from tasks._slurm import (
    describe_queue,
    query_job,
    query_jobs,
    read_jobcomp,
    show_job,
)

pytestmark = pytest.mark.integration


def submit(slurm: SlurmCluster, *options: str, wrap: str = "sleep 60") -> str:
    done = slurm.run(["sbatch", "--parsable", "-o", "/dev/null", *options, "--wrap", wrap])
    return done.stdout.strip().split(";")[0]


def wait_for(predicate, timeout: float = 20.0):  # -> the predicate's first true value
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not true within {timeout} s")


def listening(port: int) -> list[str]:
    """Return the local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


class TestPrivateCluster:
    def test_the_daemons_listen_on_127_0_0_1_only(self, slurm: SlurmCluster) -> None:
        for port in (slurm.ctld_port, slurm.slurmd_port):
            assert listening(port) == ["0100007F"], port

    def test_a_job_sees_its_end_time_though_slurm_22_05_does_not_export_it(
        self, slurm: SlurmCluster
    ) -> None:
        # Inside the job: the TaskProlog's variable, and squeue without it.
        code = (
            "import json, os\n"
            "from tasks._slurm import allocation_end, job_from_env\n"
            "j = job_from_env()\n"
            "env = {k: v for k, v in os.environ.items() if k != 'SLURM_JOB_END_TIME'}\n"
            "print(json.dumps([j.started_at, j.ends_at, allocation_end(j.job_id, env=env)]))\n"
        )
        done = slurm.run(["srun", "-t", "2", sys.executable, "-c", code], timeout=60)
        started, ends, from_squeue = json.loads(done.stdout)
        assert ends - started == 120.0
        assert from_squeue == ends


class TestQueries:
    def test_a_running_job_has_nodes_start_and_planned_end(self, slurm: SlurmCluster) -> None:
        job_id = submit(slurm, "-t", "1")
        job = wait_for(lambda: (j := query_job(job_id)) is not None and j.running and j)
        assert job.nodes == (slurm.host,)
        assert job.started_at is not None
        assert job.ends_at == job.started_at + 60.0
        assert not job.ended

    def test_a_job_that_waits_for_cores_says_so(self, slurm: SlurmCluster) -> None:
        blocker = submit(slurm, "-c", str(slurm.cpus))
        waiting = submit(slurm, "-c", "1")

        def pending_on_resources():  # -> AllocationState | None
            job = query_jobs([blocker, waiting])[waiting]
            return job if job.reason == "Resources" else None

        job = wait_for(pending_on_resources)
        assert job.state == "PENDING"
        assert describe_queue([job]) == f"waiting in queue: job {waiting} PENDING (Resources)"

    def test_a_cancelled_job_says_cancelled_everywhere(self, slurm: SlurmCluster) -> None:
        job_id = submit(slurm)
        wait_for(lambda: (j := query_job(job_id)) is not None and j.running)
        slurm.run(["scancel", job_id])
        job = wait_for(lambda: (j := query_job(job_id)) is not None and j.ended and j)
        assert job.end_reason == "cancelled"
        shown = show_job(job_id)
        assert shown is not None
        assert shown.end_reason == "cancelled"
        logged = wait_for(lambda: read_jobcomp(slurm.jobcomp, job_id))
        assert logged.end_reason == "cancelled"

    def test_a_finished_job_is_completed(self, slurm: SlurmCluster) -> None:
        job_id = submit(slurm, wrap="true")
        job = wait_for(lambda: (j := query_job(job_id)) is not None and j.ended and j)
        assert job.end_reason == "completed"

    def test_an_unknown_job_is_none(self, slurm: SlurmCluster) -> None:
        assert query_job("999999") is None
        assert query_jobs([]) == {}
