"""The RADICAL-Pilot site on Slurm: a pilot job per allocation, tasks started with srun.

Runs with the overlay Python of ``radical_python`` (RADICAL-Pilot is not in the
test extra), so each test is a subprocess. A pilot takes 40-80 s to start on this
2-core machine (RADICAL-Pilot starts ~15 agent processes in the job, one after
another) and its session ~15 s to close. The demo campaign (one round: the
verifier and the batch on the pilot) runs by default, so every change is tried on
a real pilot once; the executor-level tests, which add a second pilot or nothing
the campaign does not show, are ``long``.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from allocation_properties import (  # type: ignore[import-not-found]
    assert_allocations_follow_one_another,
    assert_each_candidate_done_once,
)
from private_slurm import SlurmCluster  # type: ignore[import-not-found]

from flows._prefect._server import ServerHandle, client_env
from tasks import load_site
from tasks._task_ledger import started_markers

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def radical_site(tmp_path: Path, **scheduler: Any) -> Path:
    """Write site-configs/slurm-radical.toml for the private cluster (2 cores, debug)."""
    data = load_site("slurm-radical", env={}).model_dump(mode="json", exclude_none=True)
    data["scheduler"] = {
        "system": "slurm",
        "partition": "debug",
        "walltime": "00:10:00",
        "prologue": ["export OMP_NUM_THREADS=1"],
        **scheduler,
    }
    data["backend"].update(cores=2, cores_per_node=2, runtime_minutes=10)
    data["max_concurrency"] = 4
    # The demo's tasks take well under a second: the example's cost model (half a node-hour
    # a simulation) would be refused as longer than this 10-minute walltime.
    data["cost"].update(simulation_seconds=5.0, verifier_seconds=1.0)
    path = tmp_path / "slurm-radical.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


@pytest.mark.long
@pytest.mark.timeout(900)
def test_a_pilot_runs_simulations_and_reports_their_slurm_job(
    radical_python: Path, slurm: SlurmCluster, tmp_path: Path
) -> None:
    site = radical_site(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from tasks import AllocationExecutor, ExecutableTask, load_site

        async def main():
            site = load_site({str(site)!r})
            work = {str(tmp_path / "work")!r}
            async with AllocationExecutor.from_site(site, work_dir=work) as ex:
                tasks = [
                    ExecutableTask([sys.executable, "-m", "tasks.demo.objective"],
                                   stdin=json.dumps([0.1 * i, 0.5]).encode())
                    for i in range(3)
                ]
                results = await ex.run_batch(tasks, key_prefix="rp/0")
            print(json.dumps([r.model_dump(mode="json") for r in results]))

        asyncio.run(main())
        """
    )
    env = {**slurm.env, "HOME": str(home)}
    done = subprocess.run(
        [str(radical_python), "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["status"] for r in results] == ["done"] * 3
    assert {r["host"] for r in results} == {slurm.host}
    (job,) = {r["job_id"] for r in results}
    assert job is not None
    assert job.isdigit()
    assert all(r["value"]["fidelity"] == "high" for r in results)
    # RADICAL-Pilot's sessions and PSI/J's scripts stay under the work directory.
    assert sorted(p.name for p in home.rglob("*")) == []
    assert not list(tmp_path.glob("rhapsody.session.*"))
    assert (tmp_path / "work" / "radical" / "sessions").is_dir()


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_tasks_of_a_cancelled_pilot_are_interrupted_and_run_on_the_next_pilot(
    radical_python: Path, slurm: SlurmCluster, tmp_path: Path
) -> None:
    site = radical_site(tmp_path)
    started = tmp_path / "started"
    started.mkdir()
    script = textwrap.dedent(
        f"""
        import asyncio, json, pathlib, subprocess, sys
        from tasks import AllocationExecutor, ExecutableTask, load_site

        STARTED = pathlib.Path({str(started)!r})
        LONG = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(600)"

        async def main():
            site = load_site({str(site)!r})
            work = {str(tmp_path / "work")!r}
            async with AllocationExecutor.from_site(site, work_dir=work) as ex:
                (first,) = [r.job_id for r in ex.allocations]
                tasks = [
                    ExecutableTask([sys.executable, "-c", LONG, str(STARTED / str(i))])
                    for i in range(2)
                ]
                batch = asyncio.ensure_future(ex.run_batch(tasks, key_prefix="rp/long"))
                while len(list(STARTED.iterdir())) < 2:
                    await asyncio.sleep(1)
                subprocess.run(["scancel", first], check=True)
                cut = await batch
                await ex.request_allocation()
                again = await ex.run_batch(
                    [ExecutableTask([sys.executable, "-m", "tasks.demo.objective"],
                                    stdin=json.dumps([0.2, 0.5]).encode())],
                    key_prefix="rp/again",
                )
            # Read after closing: the pilot still running then was let go.
            records = [r.__dict__ for r in ex.allocations]
            print(json.dumps({{
                "first": first,
                "cut": [r.model_dump(mode="json") for r in cut],
                "again": [r.model_dump(mode="json") for r in again],
                "allocations": records,
            }}))

        asyncio.run(main())
        """
    )
    env = {**slurm.env, "HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        [str(radical_python), "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    first = report["first"]
    assert [r["status"] for r in report["cut"]] == ["interrupted"] * 2, report["cut"]
    assert {r["job_id"] for r in report["cut"]} == {first}
    assert {r["error_code"] for r in report["cut"]} == {"allocation_ended"}
    (again,) = report["again"]
    assert again["status"] == "done", again
    assert again["job_id"] not in (None, first)
    jobs = {r["job_id"]: r for r in report["allocations"]}
    assert list(jobs) == [first, again["job_id"]]
    assert jobs[first]["end_reason"] == "cancelled"
    assert jobs[again["job_id"]]["end_reason"] == "released"


@pytest.mark.timeout(1200)
def test_the_demo_campaign_completes_on_the_radical_pilot_site(
    radical_python: Path,
    prefect_server: ServerHandle,
    slurm: SlurmCluster,
    tmp_path: Path,
) -> None:
    import shutil

    for item in (ROOT / "examples" / "demo").iterdir():
        shutil.copy(item, tmp_path / item.name)
    spec = tmp_path / "campaign.toml"
    spec.write_text(
        spec.read_text()
        .replace('name = "demo"', 'name = "radical-demo"')
        .replace("rounds = 4", "rounds = 1")
    )
    env = {**slurm.env, **client_env(prefect_server)}
    env["UNATTENDED_HOME"] = str(tmp_path / "home")
    env["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path / "prefect-results")
    site = radical_site(tmp_path)
    try:
        done = subprocess.run(
            [str(radical_python), "-m", "flows._cli", "run", str(spec), "--site", str(site)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1100,
        )
    finally:
        subprocess.run(
            [str(radical_python), "-m", "flows._cli", "serve", "--stop"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    database = tmp_path / "home" / "campaigns" / "radical-demo" / "provenance.db"
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT status, job_id, host FROM task_result").fetchall()
        verdicts = connection.execute("SELECT verdicts FROM attempt").fetchall()
    # One pilot job carries the round on a quiet machine; a busy one can start the pilot
    # so late that it meets its walltime, and the campaign goes on in the next pilot.
    # Either way: pilots one after another, every one but the last ended by its walltime,
    # the last let go when the campaign ended, every candidate simulated to "done" once.
    windows = assert_allocations_follow_one_another(database, between=("timeout",))
    assert windows[-1].end_reason == "released"
    jobs = {w.job_id for w in windows}
    assert_each_candidate_done_once(database, rounds=1, batch_size=8)
    assert all(job is not None and job.isdigit() and job in jobs for _, job, _ in rows)
    assert {host for _, _, host in rows} == {slurm.host}
    # The verifier ran on the pilots too: its verdicts name their jobs.
    verifier = [
        v["details"] for (text,) in verdicts for v in json.loads(text) if v["check"] == "verifier"
    ]
    assert verifier
    assert all(d["job_ids"] and set(d["job_ids"]) <= jobs for d in verifier)
    assert all(t["host"] == slurm.host for d in verifier for t in d["tasks"])
    # Every pilot task reported to the task ledger from its pilot job: a simulation's
    # supervisor left its result (what a continuation would harvest), a verifier task
    # only its started marker.
    ledger = tmp_path / "home" / "campaigns" / "radical-demo" / "task-results"
    markers = started_markers(ledger)
    results = {p.stem: json.loads(p.read_text()) for p in ledger.glob("*.result")}
    assert {m["job_id"] for m in markers.values()} <= jobs
    assert len(results) == 8
    assert {r["kind"] for r in results.values()} == {"exec"}
    assert set(results) < set(markers)  # the verifier's tasks: a marker, no result
