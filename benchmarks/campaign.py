"""What the Prefect flow costs a campaign, and how fast an approved run goes on.

Measured side by side in one run, against one real Prefect server (SQLite, a free
127.0.0.1 port, a temporary state dir) and one real ``unattended serve`` runner
(``CampaignService.serve()``, ``--query-seconds 0.5``) running throughout:

1. Orchestration overhead: a campaign of 10 rounds x 64 candidates, surrogate
   planner, a 3-rule policy, no verifier, a near-zero-cost simulation (``awk``
   reading the candidate on stdin and printing ``{"value": ...}``; the spec only
   takes an argv):
   (a) ``CampaignEngine.run()`` called directly, no Prefect (also with an in-process
       ``Simulation.function`` objective, to show what spawning ``awk`` costs);
   (b) the same campaign through ``submit_campaign`` -> deployment -> runner ->
       ``campaign_flow`` -> COMPLETED.
   Start-up = submit -> round 0 recorded (runner pick-up, process spawn, imports,
   flow engine start). Target: (b - start-up) / (a) < 2.
2. Resume latency: a campaign whose policy ASKs on round 1. Time from the
   ``approve_run(...)`` call to round 1's batch ``launched_at`` in the provenance
   database. Target < 5 s. Repeated; min and median.

    python benchmarks/campaign.py [--quick]

The runner is stopped (by PID) before the server. asyncflow writes session folders
into the working directory, so the benchmark runs from its temporary directory.
BLAS runs single-threaded on both sides (``OPENBLAS_NUM_THREADS=1`` etc., unless set):
on a busy 2-core node the surrogate's threaded BLAS was 2-4x slower and swamped the
orchestration being measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import tomli_w

DATA = Path(__file__).resolve().parent / "campaign_data"
QUERY_SECONDS = 0.5
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# sum((x_i - 0.3)^2) of the JSON list on stdin: a real objective for the surrogate, ~1 ms.
AWK_OBJECTIVE = [
    "awk",
    "-F",
    "[][,]",
    '{s=0; for(i=2;i<NF;i++) s+=($i-0.3)^2; printf "{\\"value\\": %.9f}\\n", s}',
]


def objective(candidate: list[float]) -> float:
    """Return the awk objective, computed in-process (the function simulation)."""
    return sum((x - 0.3) ** 2 for x in candidate)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_spec(folder: Path, name: str, rounds: int, batch: int, policy: str) -> Path:
    """Write a campaign spec for the benchmark; return its path."""
    spec = {
        "name": name,
        "seed": 11,
        "rounds": rounds,
        "batch_size": batch,
        "attempts": 2,
        "policy_retries": 1,
        "budget_node_hours": 1000.0,
        "site": "local",
        "policy": str(DATA / policy),
        "objective": {"lower": [0.0] * 3, "upper": [1.0] * 3, "simulation": AWK_OBJECTIVE},
        "planner": {"kind": "surrogate"},
        "approvals": {"approvers": ["alice"], "timeout_minutes": 60.0, "on_timeout": "stop"},
    }
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    return path


def stamp(moment: Any) -> float:
    """Return a provenance (ISO string) or Prefect (datetime) moment as epoch seconds."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return float(moment.timestamp())


def rounds_of(home: Path, name: str) -> list[dict[str, Any]]:
    from flows._paths import campaign_dir
    from flows._provenance import ProvenanceStore

    with ProvenanceStore.open(campaign_dir(home, name), read_only=True) as store:
        summary = store.summary(name)
    if summary["campaign"]["status"] != "completed":
        raise SystemExit(f"campaign {name} ended {summary['campaign']['status']}")
    return list(summary["rounds"])


# -- (a) the engine, no Prefect ---------------------------------------------------


async def engine_seconds(spec: Path, home: Path, *, function: bool) -> dict[str, Any]:
    """Run the campaign through ``CampaignEngine`` directly; return its timings."""
    from flows._paths import campaign_dir
    from flows._provenance import ProvenanceStore
    from flows._round import CampaignEngine, Hooks
    from flows._simulation import build_checks, build_run_batch
    from flows._spec import load_campaign
    from tasks import AllocationExecutor, Simulation, launch_batch, load_site

    loaded = load_campaign(spec)
    name = loaded.spec.name
    site = load_site("local", env=os.environ)
    # Any: ProvenanceStore.find_batch returns TaskResultRecord, not BatchStore's TaskResult.
    store: Any = ProvenanceStore.open(campaign_dir(home, name))
    store.ensure_campaign(
        name, spec=loaded.raw, site="local", seed=loaded.spec.seed, code_version="bench"
    )
    simulation = Simulation.function(objective, id="bench-objective")
    started_rounds: dict[int, float] = {}
    round_seconds: list[float] = []

    def on_event(kind: str, data: Any) -> None:
        if kind == "round":
            started_rounds[data["round"]] = time.perf_counter()
        elif kind == "batch":
            round_seconds.append(time.perf_counter() - started_rounds[data["round"]])

    async with AllocationExecutor.from_site(site) as executor:
        by_argv = build_run_batch(executor, store, loaded)

        async def by_function(index: int, candidates: list[list[float]], on_result: Any) -> Any:
            return await launch_batch(
                executor,
                store,
                campaign=name,
                round_index=index,
                candidates=candidates,
                simulation=simulation,
                on_result=on_result,
            )

        engine = CampaignEngine(
            loaded=loaded,
            store=store,
            run_batch=by_function if function else by_argv,
            node_hours_per_simulation=site.cost.node_hours_per_simulation,
            checks=build_checks(executor, loaded),
            hooks=Hooks(on_event=on_event),
            env=dict(os.environ),
        )
        began = time.perf_counter()
        result = await engine.run()
    store.close()
    total = time.perf_counter() - began
    if result.status != "completed":
        raise SystemExit(f"direct campaign {name} ended {result.status} ({result.error_code})")
    return {"total": total, "per_round": statistics.median(round_seconds)}


# -- (b) the Prefect flow ---------------------------------------------------------


def log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


async def wait_for(flow_run_id: Any, states: set[str], limit: float, log: Path) -> str:
    """Poll the run until it is in one of ``states``; exit with the runner's log if not."""
    from flows._service import read_run

    deadline = time.monotonic() + limit
    state = "NONE"
    while time.monotonic() < deadline:
        run = await read_run(flow_run_id)
        state = run.state.type.value if run.state else "NONE"
        if state in states:
            return state
        if state in TERMINAL:
            break
        await asyncio.sleep(0.2)
    tail = log_tail(log)
    raise SystemExit(f"flow run {flow_run_id} is {state}, wanted {sorted(states)}\n{tail}")


async def state_times(flow_run_id: Any, after: float) -> dict[str, float]:
    """Return when the run first entered each state after ``after`` (epoch seconds)."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        states = await client.read_flow_run_states(flow_run_id)
    found: dict[str, float] = {}
    for state in sorted(states, key=lambda s: stamp(s.timestamp)):
        moment = stamp(state.timestamp)
        if moment >= after:
            found.setdefault(state.type.value, moment)
    return found


async def flow_seconds(spec: Path, home: Path, log: Path) -> dict[str, Any]:
    """Submit the campaign, wait for COMPLETED; return its timings from the records."""
    from flows._service import read_run, submit_campaign

    submitted_at = time.time()
    submitted = await submit_campaign(spec, state_dir=home)
    submit_call = time.time() - submitted_at
    await wait_for(submitted.flow_run_id, {"COMPLETED"}, 600, log)
    run = await read_run(submitted.flow_run_id)
    states = await state_times(submitted.flow_run_id, submitted_at)
    rounds = rounds_of(home, spec.stem)
    first = stamp(rounds[0]["started_at"])
    last = stamp(rounds[-1]["finished_at"])
    ended = stamp(run.end_time)
    return {
        "total": ended - submitted_at,
        "startup": first - submitted_at,
        "submit_call": submit_call,
        "pickup": states.get("PENDING", float("nan")) - submitted_at,
        "running": states.get("RUNNING", float("nan")) - submitted_at,
        "rounds": last - first,
        "after": ended - last,
        "per_round": statistics.median(
            stamp(r["finished_at"]) - stamp(r["started_at"]) for r in rounds
        ),
    }


# -- 2. resume latency ------------------------------------------------------------


async def resume_latencies(
    folder: Path, home: Path, log: Path, repeat: int
) -> list[dict[str, Any]]:
    """Suspend ``repeat`` campaigns on round 1, then approve them one at a time."""
    from flows._paths import campaign_dir
    from flows._provenance import ProvenanceStore
    from flows._service import approve_run, submit_campaign

    runs = []
    for i in range(repeat):
        spec = write_spec(folder, f"bench-resume-{i}", 2, 8, "approval-policy.toml")
        runs.append((spec.stem, (await submit_campaign(spec, state_dir=home)).flow_run_id))
    for _, flow_run_id in runs:
        await wait_for(flow_run_id, {"PAUSED"}, 300, log)
    measured = []
    for name, flow_run_id in runs:
        await asyncio.sleep(2 * QUERY_SECONDS)  # the runner is idle, mid-poll, as in real life
        approved_at = time.time()
        await approve_run(flow_run_id, approver="alice", comment="benchmark")
        call = time.time() - approved_at
        await wait_for(flow_run_id, {"COMPLETED"}, 300, log)
        states = await state_times(flow_run_id, approved_at)
        with ProvenanceStore.open(campaign_dir(home, name), read_only=True) as store:
            batches = store.round_view(name, 1)["batches"]
        measured.append(
            {
                "call": call,
                "pickup": states.get("PENDING", float("nan")) - approved_at,
                "running": states.get("RUNNING", float("nan")) - approved_at,
                "launched": stamp(batches[0]["launched_at"]) - approved_at,
            }
        )
    return measured


def import_seconds(folder: Path) -> tuple[float, float]:
    """Time a fresh process importing the flow module (wall, CPU): a run's start-up floor."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import flows._campaign"], cwd=folder, check=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


# -- the run ----------------------------------------------------------------------


def start_runner(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``unattended serve`` (``CampaignService.serve()``) in its own session."""
    command = [sys.executable, "-m", "flows._cli", "serve", "--query-seconds", str(QUERY_SECONDS)]
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def stop_runner(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the runner's process group; SIGKILL it after 20 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


async def measure(folder: Path, args: argparse.Namespace, log: Path) -> None:
    rounds, batch = (4, 64) if args.quick else (10, 64)
    reps, resume_reps = (1, 3) if args.quick else (2, 3)
    direct, direct_fn, flow = [], [], []
    for rep in range(reps):  # alternate, keep the best of each
        spec = write_spec(folder, f"bench-direct-{rep}", rounds, batch, "policy.toml")
        direct.append(await engine_seconds(spec, folder / "direct", function=False))
        spec = write_spec(folder, f"bench-function-{rep}", rounds, batch, "policy.toml")
        direct_fn.append(await engine_seconds(spec, folder / "direct", function=True))
        spec = write_spec(folder, f"bench-flow-{rep}", rounds, batch, "policy.toml")
        flow.append(await flow_seconds(spec, folder / "home", log))
    a = min(direct, key=lambda r: r["total"])
    af = min(direct_fn, key=lambda r: r["total"])
    b = min(flow, key=lambda r: r["total"] - r["startup"])
    resumed = await resume_latencies(folder, folder / "home", log, resume_reps)
    floor = import_seconds(folder)
    print_table(rounds, batch, reps, a, af, b, resumed, floor)


def print_table(
    rounds: int,
    batch: int,
    reps: int,
    a: dict[str, Any],
    af: dict[str, Any],
    b: dict[str, Any],
    resumed: list[dict[str, Any]],
    floor: tuple[float, float],
) -> None:
    print(
        f"\n1. orchestration: {rounds} rounds x {batch} candidates, surrogate planner, "
        f"3-rule policy, no verifier (best of {reps})"
    )
    print(f"   {'':46} {'total s':>9} {'per round s':>12}")
    print(f"   {'(a) CampaignEngine, awk simulation':46} {a['total']:9.2f} {a['per_round']:12.3f}")
    print(
        f"   {'(a) CampaignEngine, function simulation':46} {af['total']:9.2f} "
        f"{af['per_round']:12.3f}"
    )
    print(
        f"   {'(b) Prefect flow, submit -> COMPLETED':46} {b['total']:9.2f} {b['per_round']:12.3f}"
    )
    print(f"       start-up: submit -> round 0 recorded       {b['startup']:9.2f}")
    print(f"         submit call (deployment + run)            {b['submit_call']:9.2f}")
    print(f"         submit -> runner picked it up (PENDING)   {b['pickup']:9.2f}")
    print(f"         submit -> flow process RUNNING            {b['running']:9.2f}")
    print(f"         RUNNING -> round 0 recorded               {b['startup'] - b['running']:9.2f}")
    print(f"       round 0 start -> last round checkpoint     {b['rounds']:9.2f}")
    print(f"       last checkpoint -> flow run COMPLETED      {b['after']:9.2f}")
    ratio = (b["total"] - b["startup"]) / a["total"]
    verdict = "ok" if ratio < 2.0 else "ABOVE TARGET"
    print(f"   (b - start-up) / (a) = {ratio:.2f}   (target < 2: {verdict})")
    print(
        f"   (b rounds only) / (a) = {b['rounds'] / a['total']:.2f}; Prefect cost per round "
        f"{(b['rounds'] - a['total']) / rounds:+.3f} s; awk / function simulation = "
        f"{a['total'] / af['total']:.2f}"
    )
    print(
        f"\n2. resume: approve_run() -> round 1 batch launched "
        f"(runner query {QUERY_SECONDS} s, {len(resumed)} runs)"
    )
    print(f"   {'run':>5} {'approve call':>13} {'picked up':>10} {'RUNNING':>9} {'launched':>9}")
    for i, r in enumerate(resumed):
        print(
            f"   {i:5} {r['call']:13.2f} {r['pickup']:10.2f} {r['running']:9.2f} "
            f"{r['launched']:9.2f}"
        )
    launched = [r["launched"] for r in resumed]
    verdict = "ok" if statistics.median(launched) < 5.0 else "ABOVE TARGET"
    print(
        f"   min {min(launched):.2f} s, median {statistics.median(launched):.2f} s "
        f"(target < 5 s: {verdict})"
    )
    wall, cpu = floor
    stretch = wall / cpu if cpu > 0 else float("nan")
    print(
        f"   floor: a fresh process importing flows._campaign: {wall:.2f} s wall, {cpu:.2f} s CPU"
        f"\n   load stretch (wall / CPU of that import) {stretch:.1f}x; resume median / stretch "
        f"= {statistics.median(launched) / stretch:.2f} s (a rough idle-node estimate)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds, one repetition")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    for variable in BLAS_THREADS:  # before numpy is imported, here and in the runner
        os.environ.setdefault(variable, "1")
    folder = Path(tempfile.mkdtemp(prefix="unattended-bench-campaign-"))
    os.chdir(folder)  # asyncflow's session folders land here, not in the checkout

    from flows._server import ServerConfig, client_env, start_server, stop_server

    config = ServerConfig(port=free_port(), state_dir=folder / "server")
    began = time.perf_counter()
    handle = start_server(config, timeout=120)
    print(
        "load average (1, 5, 15 min) at the start: "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg())
        + f" on {os.cpu_count()} CPUs"
    )
    print(
        f"server ready in {time.perf_counter() - began:.1f} s on {handle.api_url} "
        f"(pid {handle.pid}); work dir {folder}",
        flush=True,
    )
    os.environ.update(client_env(handle))
    os.environ["UNATTENDED_HOME"] = str(folder / "home")
    log = folder / "runner.log"
    runner = start_runner(dict(os.environ), log)
    try:
        asyncio.run(measure(folder, args, log))
        print(
            "load average (1, 5, 15 min) at the end: "
            + ", ".join(f"{x:.1f}" for x in os.getloadavg())
            + f" on {os.cpu_count()} CPUs"
        )
    finally:
        stop_runner(runner)  # before the server: the other order hangs for minutes
        stop_server(config)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
