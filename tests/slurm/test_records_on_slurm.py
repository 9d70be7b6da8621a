"""What the provenance says of tasks cut by an allocation's end (issue 43).

Each allocation is one 1-core job, so the batch's two simulations run one after
the other: when the job is cancelled while the first runs, the first was running
in that job and the second had not started. An interrupted task is credited to
the job and node it started in (its started marker in the task ledger), or to no
job when it never started; not to whichever job ended last. All three allocations are
cancelled before any simulation finishes (the batch and its two relaunches, the
most a batch is relaunched without progress): the round produced no result, and is
not recorded ``completed``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from private_slurm import SlurmCluster  # type: ignore[import-not-found]
from test_campaign_on_slurm import (  # type: ignore[import-not-found]
    campaign,
    database_of,
    rows,
    site_file,
    start_direct,
)

from tasks._task_ledger import started_markers

pytestmark = [pytest.mark.integration]


def started_jobs(ledger: Path, campaign: str) -> dict[str, dict[str, object]]:
    """Return the started markers of the campaign's simulations by job id (no verifier's)."""
    found = {}
    for marker in started_markers(ledger).values():
        if str(marker["key"]).startswith(f"{campaign}/"):
            found[str(marker["job_id"])] = marker
    return found


@pytest.mark.timeout(600)
def test_interrupted_tasks_are_credited_to_their_own_job_and_an_empty_round_is_not_completed(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    name = "credit"
    spec, log = campaign(tmp_path, name, rounds=1, batch_size=2, seconds=120.0)
    site = site_file(tmp_path, max_allocations=3, poll_seconds=1.0)
    ledger = tmp_path / "home" / "campaigns" / name / "task-results"
    cancelled: list[str] = []
    run = start_direct(slurm, tmp_path, spec, site)
    try:
        deadline = time.monotonic() + 400
        while len(cancelled) < 3 and run.poll() is None:
            assert time.monotonic() < deadline, "no simulation started"
            # A simulation has started in a job not yet cancelled: cancel that job.
            for job in started_jobs(ledger, name):
                if job not in cancelled:
                    slurm.run(["scancel", job])
                    cancelled.append(job)
            time.sleep(0.2)
        code = run.wait(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    output = (tmp_path / "run.out").read_text()
    # Nothing produced a value: the campaign fails (issue 44), and says why.
    assert code == 1, output[-3000:]
    assert "no simulation produced a value" in output, output[-3000:]
    assert not log.exists() or not log.read_text().strip()  # no simulation finished
    database = database_of(tmp_path, name)
    results = rows(
        database,
        "SELECT b.relaunch, t.task_index, t.status, t.job_id, t.host FROM task_result t "
        "JOIN batch b ON b.id = t.batch_id ORDER BY b.relaunch, t.task_index",
    )
    assert {status for _, _, status, _, _ in results} == {"interrupted"}, results
    markers = started_jobs(ledger, name)
    for relaunch, _index, _, job, host in results:
        if job is None:  # never started: no job, no node
            assert host in ("", None), results
        else:  # the job it started in, on that job's node
            assert job == cancelled[relaunch], results
            assert host == markers[job]["node"] == slurm.host, results
    # Per batch: the first simulation ran in the cancelled job, the second never started.
    assert [(r, i, j) for r, i, _, j, _ in results][:2] == [(0, 0, cancelled[0]), (0, 1, None)]
    assert rows(database, "SELECT status FROM round WHERE round_index = 0") == [("failed",)]
