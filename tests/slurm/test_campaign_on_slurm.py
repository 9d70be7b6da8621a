"""Campaigns on Dask-on-Slurm end to end: the real CLI, a real Prefect server, real Slurm jobs.

``unattended run SPEC --site <slurm-local site>`` submits the campaign to the
session's Prefect server, starts the background runner and follows the run to
its end; the runner's flow-run process starts the executor, whose workers are
jobs of the session's private Slurm. The runner is stopped (``serve --stop``)
after each test. The provenance database is then read back.

The simulation is a small script that evaluates the demo objective and appends
``<round> <index> <job>`` to a log when it finishes: a candidate simulated twice
to completion would show twice.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from allocation_properties import (  # type: ignore[import-not-found]
    assert_allocations_follow_one_another,
)
from private_slurm import SlurmCluster  # type: ignore[import-not-found]

from flows._prefect._server import ServerHandle, client_env
from tasks import load_site

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "demo"

SIMULATION = textwrap.dedent(
    """
    import json, os, sys, time
    from tasks.demo._objective import objective
    round_, index, log, seconds = sys.argv[1:5]
    data = json.load(sys.stdin)
    x = data["x"] if isinstance(data, dict) else data
    verifier = round_ == "{round}"  # the verifier runs the same argv, unfilled
    value = objective([float(v) for v in x], "low" if verifier else "high")
    if not verifier:
        time.sleep(float(seconds))
        with open(log, "a", encoding="ascii") as out:
            out.write(f"{round_} {index} {os.environ.get('SLURM_JOB_ID')}\\n")
    print(json.dumps({"value": value}))
    """
)


def campaign(
    tmp_path: Path, name: str, *, rounds: int, batch_size: int, seconds: float
) -> tuple[Path, Path]:
    """Write the demo campaign with the logging simulation; return (spec, completion log)."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    script = tmp_path / "simulation.py"
    script.write_text(SIMULATION, encoding="utf-8")
    log = tmp_path / "completions.txt"
    spec = tmp_path / "campaign.toml"
    text = spec.read_text()
    argv = [sys.executable, str(script), "{round}", "{index}", str(log), str(seconds)]
    replacements = {
        'name = "demo"': f'name = "{name}"',
        "rounds = 4": f"rounds = {rounds}",
        "batch_size = 8": f"batch_size = {batch_size}",
        'simulation = "demo"': f"simulation = {json.dumps(argv)}",
    }
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    spec.write_text(text)
    return spec, log


def site_file(tmp_path: Path, **scheduler: Any) -> Path:
    """Write site-configs/slurm-local.toml with ``scheduler`` and cost changes; return it."""
    data = load_site("slurm-local", env={}).model_dump(mode="json", exclude_none=True)
    data.pop("secrets", None)
    cost = scheduler.pop("cost", {})
    data["scheduler"].update(scheduler)
    data["cost"].update(cost)
    data["retry_backoff"] = 0.0
    path = tmp_path / "slurm-site.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


def cli_env(server: ServerHandle, slurm: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    env = {**slurm.env, **client_env(server)}
    env["UNATTENDED_HOME"] = str(tmp_path / "home")
    env["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path / "prefect-results")
    return env


def unattended(env: dict[str, str], *args: str, cwd: Path, timeout: float) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "flows._cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_direct(slurm: SlurmCluster, tmp_path: Path, spec: Path, site: Path) -> Any:
    """Start the campaign in its own process (``flows._cli._direct``), output to run.out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    env |= slurm.env
    argv = [sys.executable, "-m", "flows._cli._direct", str(spec), "--site", str(site)]
    with (tmp_path / "run.out").open("w") as out:
        return subprocess.Popen(
            [*argv, "--state-dir", str(tmp_path / "home")],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def rows(database: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as connection:
        return connection.execute(query).fetchall()


def database_of(tmp_path: Path, name: str) -> Path:
    return tmp_path / "home" / "campaigns" / name / "provenance.db"


def assert_every_candidate_once(database: Path, log: Path, rounds: int, batch_size: int) -> None:
    """Each candidate has one done result, and its simulation completed exactly once."""
    final = rows(
        database,
        "SELECT b.round_index, b.relaunch, t.task_index, t.status FROM task_result t "
        "JOIN batch b ON b.id = t.batch_id ORDER BY b.round_index, b.relaunch",
    )
    assert all(status in ("done", "interrupted") for *_, status in final)
    done_per_round = Counter(round_ for round_, _, _, status in final if status == "done")
    assert done_per_round == dict.fromkeys(range(rounds), batch_size)
    completed = Counter(tuple(line.split()[:2]) for line in log.read_text().splitlines())
    expected = {(str(r), str(i)) for r in range(rounds) for i in range(batch_size)}
    assert set(completed) == expected
    assert max(completed.values()) == 1, completed


@pytest.fixture
def runner_stopped(
    prefect_server: ServerHandle, slurm: SlurmCluster, tmp_path: Path
) -> Iterator[None]:
    """Stop the background runner `unattended run` starts, whatever the test did."""
    yield
    env = cli_env(prefect_server, slurm, tmp_path)
    unattended(env, "serve", "--stop", cwd=tmp_path, timeout=60)


@pytest.mark.timeout(600)
def test_the_demo_campaign_records_the_slurm_job_of_every_task(
    prefect_server: ServerHandle, slurm: SlurmCluster, tmp_path: Path, runner_stopped: None
) -> None:
    name = "slurm-demo"
    # The demo's recorded answers hold 8 candidates: with 8 the verifier runs on them.
    spec, log = campaign(tmp_path, name, rounds=2, batch_size=8, seconds=0.0)
    env = cli_env(prefect_server, slurm, tmp_path)
    done = unattended(
        env, "run", str(spec), "--site", str(ROOT / "site-configs" / "slurm-local.toml"),
        cwd=tmp_path, timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    database = database_of(tmp_path, name)
    # One job on a quiet machine; on a busy one the campaign may meet the walltime and
    # go on in the next job: jobs one after another, the last let go at the end.
    jobs = {w.job_id for w in assert_allocations_follow_one_another(database)}
    results = rows(
        database, "SELECT job_id, host, allocation_start, allocation_end, status FROM task_result"
    )
    for job, host, start, end, status in results:
        assert status in ("done", "interrupted")
        assert job in jobs
        assert host == slurm.host
        assert start is not None
        assert end is not None
    # The verifier's tasks: their jobs are on the verifier spans of the telemetry file.
    spans = [
        json.loads(line)
        for line in (database.parent / "telemetry.jsonl").read_text().splitlines()
        if '"verifier verifier"' in line
    ]
    assert spans
    for span in spans:
        assert set(span["attributes"]["unattended.verifier.job_ids"]) <= set(jobs)
    # ... and in the provenance: every verifier verdict names its tasks' jobs.
    verifier_tasks = verifier_tasks_of(database)
    assert verifier_tasks
    for task in verifier_tasks:
        assert task["job_id"] in jobs
        assert task["host"] == slurm.host
        assert task["status"] in ("done", "interrupted")
    assert_every_candidate_once(database, log, rounds=2, batch_size=8)


def verifier_tasks_of(database: Path) -> list[dict[str, Any]]:
    """Return every verifier task recorded in the attempts' verdicts (details.tasks)."""
    found = []
    for (text,) in rows(database, "SELECT verdicts FROM attempt"):
        for verdict in json.loads(text):
            if verdict["check"] == "verifier":
                details = verdict["details"]
                assert details["job_ids"] == sorted({t["job_id"] for t in details["tasks"]})
                found += details["tasks"]
    return found


def wait_for(predicate, timeout: float):  # -> the predicate's first true value
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not true within {timeout} s")


@pytest.mark.timeout(600)
def test_scancel_mid_batch_the_campaign_relaunches_exactly_the_interrupted_candidates(
    prefect_server: ServerHandle, slurm: SlurmCluster, tmp_path: Path, runner_stopped: None
) -> None:
    name = "slurm-scancel"
    spec, log = campaign(tmp_path, name, rounds=2, batch_size=4, seconds=4.0)
    env = cli_env(prefect_server, slurm, tmp_path)
    site = ROOT / "site-configs" / "slurm-local.toml"
    with (tmp_path / "run.out").open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "flows._cli", "run", str(spec), "--site", str(site)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # Once the first simulation has completed, the allocation is mid-batch.
        wait_for(lambda: log.exists() and log.read_text().strip(), timeout=300)
        database = database_of(tmp_path, name)
        (job,) = rows(database, "SELECT job_id FROM allocation WHERE end_reason IS NULL")[0:1]
        slurm.run(["scancel", job[0]])
        code = run.wait(timeout=480)
    finally:
        if run.poll() is None:
            run.kill()
    output = (tmp_path / "run.out").read_text()
    assert code == 0, output[-3000:]
    windows = assert_allocations_follow_one_another(database, between=("cancelled", "timeout"))
    assert (job[0], "cancelled") in {(w.job_id, w.end_reason) for w in windows}
    assert len(windows) >= 2
    interrupted = rows(database, "SELECT job_id FROM task_result WHERE status = 'interrupted'")
    assert interrupted
    # Each cut task names the job it had started in (the cancelled one), or none.
    assert {j for (j,) in interrupted} <= {job[0], None}, interrupted
    # Tasks are cut only where a job ended under them: the scancel, or (busy machine) a
    # walltime; a task cut before it started names no job.
    cut_in = {j for (j,) in interrupted} - {None}
    assert cut_in <= {w.job_id for w in windows if w.end_reason != "released"}
    relaunches = rows(database, "SELECT relaunch FROM batch WHERE relaunch > 0")
    assert relaunches
    assert_every_candidate_once(database, log, rounds=2, batch_size=4)
    # run's plain lines say it (issue 21): the cut, the job's end, the job that ran them again.
    said = [line for line in output.splitlines() if "task(s) interrupted" in line]
    assert any(f"job {job[0]} ended: cancelled" in line for line in said), output[-3000:]
    assert any("; relaunched in job" in line for line in said), output[-3000:]
    assert "batch of 4 task(s) launched" in output


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_one_minute_allocations_carry_a_campaign_through_three_of_them_unattended(
    prefect_server: ServerHandle, slurm: SlurmCluster, tmp_path: Path, runner_stopped: None
) -> None:
    """The cost model underestimates (1 s a task): batches meet the walltime and resume."""
    name = "slurm-walltime"
    spec, log = campaign(tmp_path, name, rounds=2, batch_size=4, seconds=20.0)
    site = site_file(
        tmp_path, walltime="00:01:00", max_allocations=12, cost={"simulation_seconds": 1.0}
    )
    env = cli_env(prefect_server, slurm, tmp_path)
    done = unattended(env, "run", str(spec), "--site", str(site), cwd=tmp_path, timeout=1100)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    database = database_of(tmp_path, name)
    windows = assert_allocations_follow_one_another(database, between=("timeout",))
    assert len(windows) >= 3
    assert rows(database, "SELECT count(*) FROM task_result WHERE status = 'interrupted'")[0][0]
    assert_every_candidate_once(database, log, rounds=2, batch_size=4)
    humans = rows(database, "SELECT count(*) FROM approval")[0][0]
    assert humans == 0


@pytest.mark.long  # the default run meets a walltime mid-batch (test_executor_on_slurm)
@pytest.mark.timeout(600)
def test_a_batch_that_would_not_fit_waits_for_a_fresh_allocation(
    prefect_server: ServerHandle, slurm: SlurmCluster, tmp_path: Path, runner_stopped: None
) -> None:
    """With an honest cost model no task is interrupted: each batch starts in a fresh job."""
    name = "slurm-fits"
    spec, log = campaign(tmp_path, name, rounds=2, batch_size=2, seconds=12.0)
    # 2 x 12 s per batch plus verifiers: what is left of a 1-minute job after round 0
    # cannot hold round 1, so round 1 asks for the next job instead of being cut.
    site = site_file(
        tmp_path,
        walltime="00:01:00",
        max_allocations=6,
        cost={"simulation_seconds": 25.0, "verifier_seconds": 2.0},
    )
    env = cli_env(prefect_server, slurm, tmp_path)
    done = unattended(env, "run", str(spec), "--site", str(site), cwd=tmp_path, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    database = database_of(tmp_path, name)
    assert rows(database, "SELECT count(*) FROM task_result WHERE status = 'interrupted'") == [(0,)]
    reasons = [r for (r,) in rows(database, "SELECT end_reason FROM allocation ORDER BY request")]
    assert len(reasons) >= 2
    assert set(reasons) == {"released"}
    assert_every_candidate_once(database, log, rounds=2, batch_size=2)


def test_cli_environment_names_the_private_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The CLI's children reach the private Slurm through SLURM_CONF alone."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env["SLURM_CONF"] = str(slurm.conf)
    done = subprocess.run(["sinfo", "-h", "-o", "%P"], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "debug*"
