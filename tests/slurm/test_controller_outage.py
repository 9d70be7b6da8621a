"""A Slurm controller outage is not the end of the jobs (issue 43).

While ``slurmctld`` is down ``squeue`` exits 1 ("Unable to contact slurm
controller") with empty output. The campaign's jobs run on under their slurmd, and
so do its tasks: the campaign must kill none of them, ask for no other allocation,
and record the outage. Here the controller of the session's private Slurm is
stopped (SIGTERM) for ``OUTAGE_SECONDS`` while a batch runs, then started again
from its saved state; the campaign runs in its own process (``flows._cli._direct``)
with ``max_allocations = 1``, so a second allocation would stop it ``blocked``.
Every completion is counted by the simulation's own log.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from private_slurm import SlurmCluster  # type: ignore[import-not-found]
from test_campaign_on_slurm import (  # type: ignore[import-not-found]
    assert_every_candidate_once,
    campaign,
    database_of,
    rows,
    site_file,
    start_direct,
    wait_for,
)

pytestmark = [pytest.mark.integration]

#: How long the controller stays down: longer than a task, shorter than the setting.
OUTAGE_SECONDS = 60.0


@pytest.mark.timeout(600)
def test_a_controller_down_for_a_minute_kills_nothing_and_takes_no_allocation(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    name = "ctld-outage"
    spec, log = campaign(tmp_path, name, rounds=1, batch_size=4, seconds=20.0)
    site = site_file(tmp_path, max_allocations=1, poll_seconds=1.0)
    run = start_direct(slurm, tmp_path, spec, site)
    stopped_at = restarted_at = 0.0
    try:
        # The first simulation completed: the batch is mid-way on the allocation.
        wait_for(lambda: log.exists() and log.read_text().strip(), timeout=300)
        slurm.stop_controller()
        stopped_at = time.monotonic()
        assert slurm.run(["squeue", "-h"], check=False).returncode != 0
        time.sleep(OUTAGE_SECONDS)  # the outage itself: what the test is about
        slurm.start_controller()
        restarted_at = time.monotonic()
        code = run.wait(timeout=400)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if not restarted_at and stopped_at:
            slurm.start_controller()
    output = (tmp_path / "run.out").read_text()
    assert code == 0, output[-3000:]
    result = json.loads(output.strip().splitlines()[-1])
    assert result["status"] == "completed", result
    database = database_of(tmp_path, name)
    # No task was cut (0 interrupted), each ran once, in the one allocation there was.
    assert rows(database, "SELECT count(*) FROM task_result WHERE status != 'done'") == [(0,)]
    assert_every_candidate_once(database, log, rounds=1, batch_size=4)
    allocations = rows(database, "SELECT job_id, end_reason FROM allocation")
    assert [reason for _, reason in allocations] == ["released"], allocations
    completions = log.read_text().splitlines()
    assert {line.split()[2] for line in completions} == {allocations[0][0]}
    # The outage is in the provenance: when Slurm stopped answering, and when again.
    events = rows(
        database, "SELECT kind, details FROM campaign_event WHERE kind LIKE 'slurm_%' ORDER BY id"
    )
    assert [kind for kind, _ in events] == ["slurm_unreachable", "slurm_reachable"], events
    assert json.loads(events[0][1])["jobs"] == [allocations[0][0]]
    assert json.loads(events[1][1])["seconds"] >= OUTAGE_SECONDS - 5
