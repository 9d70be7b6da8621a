"""What the Prefect flow costs a campaign, next to the engine alone and a plain Prefect flow.

Measured side by side in one run, against one real Prefect server (SQLite, a free
127.0.0.1 port, a temporary state dir), one real ``unattended serve`` runner with
default settings and one plain Prefect runner (``flow.serve``) running throughout.
The same campaign (R rounds x 64 candidates, 3 dimensions, a near-zero-cost ``awk``
simulation reading the candidate on stdin) runs four ways, the order rotated each
repetition so load drifts hit all alike:

(a) ``CampaignEngine.run()`` called directly: no Prefect (surrogate planner, a
    3-rule policy, no verifier; provenance recorded);
(b) the same campaign through ``submit_campaign`` (and the runner's nudge, as
    ``unattended submit`` sends it) -> deployment -> runner -> ``campaign_flow``;
(c) a plain Prefect flow doing the same work like for like
    (``campaign_data/plain_flow.py``, ``plain_planned_rounds``): the same planner (one
    surrogate proposal a round), the same task layout (three tasks a round), the same
    child-exit watcher; no gate, fallback, policy, provenance or checkpoint;
(d) the simplest plain flow (``plain_rounds``): random candidates, one task a round.

Both plain flows are served by Prefect's own runner polling as often as ours
(``PREFECT_RUNNER_POLL_FREQUENCY`` = ``RUNNER_QUERY_SECONDS``, 1 s; Prefect's default is
10 s). Ours is also woken by ``submit``; a plain run is found at the next poll, half a
poll later on average: that difference is ours to claim.

Each round splits into the batch (launched -> last result: the simulations, the
science; from the provenance's batch record, or the plain flow's own stamps) and the
rest (non-science: planning, the gate, policies, records, Prefect's task runs).

Reported apart, as medians with the load average: start-up (submit -> round 0
started), the cost per round (one round's start -> the next round's start, so closing a
round counts on every side), and the end (last round -> flow run COMPLETED). What a user
waits for on submit, resume and exit, warm start against cold, is
``benchmarks/latency.py``.

    python benchmarks/campaign.py [--quick] [--reps N]

The runners are stopped (by PID) before the server. asyncflow writes session folders
into the working directory, so the benchmark runs from its temporary directory.
BLAS runs single-threaded on every side (``OPENBLAS_NUM_THREADS=1`` etc., unless set):
on a busy 2-core node the surrogate's threaded BLAS was 2-4x slower and swamped the
orchestration being measured.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
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


def write_spec(
    folder: Path,
    name: str,
    rounds: int,
    batch: int,
    policy: str,
    simulation: list[str] | None = None,
) -> Path:
    """Write a campaign spec for the benchmark (the awk simulation by default); return its path."""
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
        "objective": {
            "lower": [0.0] * 3,
            "upper": [1.0] * 3,
            "simulation": simulation or AWK_OBJECTIVE,
        },
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
    """Return the campaign's rounds from its provenance, each with its batch's ``science``.

    ``science`` is the batch's span (launched -> finished, in seconds): the simulations.
    """
    from flows._paths import campaign_dir
    from flows._provenance import ProvenanceStore

    with ProvenanceStore.open(campaign_dir(home, name), read_only=True) as store:
        summary = store.summary(name)
        if summary["campaign"]["status"] != "completed":
            raise SystemExit(f"campaign {name} ended {summary['campaign']['status']}")
        rounds = [dict(r) for r in summary["rounds"]]
        for row in rounds:
            batch = store.round_view(name, row["index"])["batches"][-1]
            row["science"] = stamp(batch["finished_at"]) - stamp(batch["launched_at"])
    return rounds


def round_medians(starts: list[float], science: list[float]) -> dict[str, float]:
    """Return the median round (one start to the next) and its non-science part.

    A round is measured from its start to the next round's start, on every side: what
    a round costs includes closing it (the last Prefect task's completion, the
    checkpoint), whichever side of a round's own record that falls. The last round,
    with no next start, is left out.
    """
    spans = [after - before for before, after in itertools.pairwise(starts)]
    if not spans:
        raise SystemExit("a campaign of one round has no round-to-round span")
    return {
        "per_round": statistics.median(spans),
        "science": statistics.median(science),
        "non_science": statistics.median(
            span - batch for span, batch in zip(spans, science, strict=False)
        ),
    }


# -- (a) the engine, no Prefect ---------------------------------------------------


async def engine_seconds(spec: Path, home: Path, *, function: bool) -> dict[str, Any]:
    """Run the campaign through ``CampaignEngine`` directly; return its timings."""
    from flows._engine._round import CampaignEngine, Hooks
    from flows._engine._simulation import build_gate, build_run_batch
    from flows._engine._store_thread import StoreThread
    from flows._paths import campaign_dir
    from flows._provenance import ProvenanceStore
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
    started_rounds: list[float] = []

    def on_event(kind: str, data: Any) -> None:
        if kind == "round":
            started_rounds.append(time.perf_counter())

    async with StoreThread(store) as writes, AllocationExecutor.from_site(site) as executor:
        by_argv = build_run_batch(executor, writes, loaded)

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

        checks, scores = build_gate(executor, loaded)
        engine = CampaignEngine(
            loaded=loaded,
            store=writes,
            run_batch=by_function if function else by_argv,
            node_hours_per_simulation=site.cost.node_hours_per_simulation,
            checks=checks,
            scores=scores,
            hooks=Hooks(on_event=on_event),
            env=dict(os.environ),
        )
        began = time.perf_counter()
        result = await engine.run()
    store.close()
    total = time.perf_counter() - began
    if result.status != "completed":
        raise SystemExit(f"direct campaign {name} ended {result.status} ({result.error_code})")
    science = [r["science"] for r in rounds_of(home, name)]
    return {"total": total, **round_medians(started_rounds, science)}


# -- (b) the Prefect flow ---------------------------------------------------------


def log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


async def wait_for(flow_run_id: Any, states: set[str], limit: float, log: Path) -> str:
    """Poll the run until it is in one of ``states``; exit with the runner's log if not."""
    from flows._prefect._service import read_run

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
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._nudge import nudge_runner
    from flows._prefect._service import read_run

    submitted_at = time.time()
    submitted = await submit_campaign(spec, state_dir=home)
    nudge_runner(RUNNER_PID[0])  # what `unattended submit` does after submitting
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
        **round_medians([stamp(r["started_at"]) for r in rounds], [r["science"] for r in rounds]),
    }


# -- (c) a plain Prefect flow ------------------------------------------------------


async def plain_seconds(
    folder: Path, rep: int, rounds: int, batch: int, deployment: str
) -> dict[str, Any]:
    """Run a plain flow's deployment; return its timings from its own records."""
    import json

    from prefect.deployments import run_deployment

    timings = folder / f"{deployment.replace('/', '-')}-{rep}.jsonl"
    submitted_at = time.time()
    flow_run = await run_deployment(  # type: ignore[misc]
        deployment,
        parameters={"timings": str(timings), "rounds": rounds, "batch": batch},
        timeout=0,
    )
    await wait_for(flow_run.id, {"COMPLETED"}, 600, folder / "plain-runner.log")
    from flows._prefect._service import read_run

    run = await read_run(flow_run.id)
    rows = [json.loads(line) for line in timings.read_text().splitlines()]
    first, last, ended = rows[0]["started"], rows[-1]["finished"], stamp(run.end_time)
    return {
        "total": ended - submitted_at,
        "startup": first - submitted_at,
        "rounds": last - first,
        "after": ended - last,
        **round_medians([r["started"] for r in rows], [r["landed"] - r["launched"] for r in rows]),
    }


# -- the run ----------------------------------------------------------------------


RUNNER_PID = [0]  # our runner's pid, for the nudge
PLAIN_RUNNER = (
    "import sys; sys.path.insert(0, sys.argv[1]); from prefect import serve; "
    "from plain_flow import plain_planned_rounds, plain_rounds; "
    "serve(plain_rounds.to_deployment(name='plain'), "
    "plain_planned_rounds.to_deployment(name='planned'), limit=None)"
)
PLAIN_DEPLOYMENTS = {"plain": "plain-rounds/plain", "planned": "plain-planned-rounds/planned"}


def start_process(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a runner in its own session, logging to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def wait_for_line(log: Path, text: str, limit: float = 180) -> None:
    deadline = time.monotonic() + limit
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        if time.monotonic() > deadline:
            raise SystemExit(f"no '{text}' in {log}:\n{log_tail(log)}")
        time.sleep(0.2)


def stop_runner(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the runner's process group; SIGKILL it after 20 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def serve_ours(
    folder: Path, database_url: str | None = None
) -> tuple[Any, subprocess.Popen[bytes]]:
    """Start a server (a free port; SQLite unless ``database_url``) and our runner under ``folder``.

    Points this process at them (the client environment, ``UNATTENDED_HOME`` =
    ``folder/home``); the runner logs to ``folder/runner.log``. Returns the server's
    config (for ``stop_server``) and the runner's process.
    """
    from flows._prefect._server import ServerConfig, client_env, start_server

    config = ServerConfig(port=free_port(), state_dir=folder / "server", database_url=database_url)
    handle = start_server(config, timeout=180)
    os.environ.update(client_env(handle))
    os.environ["UNATTENDED_HOME"] = str(folder / "home")
    runner = start_process(
        [sys.executable, "-m", "flows._cli", "serve"], dict(os.environ), folder / "runner.log"
    )
    RUNNER_PID[0] = runner.pid
    return config, runner


SIDES = ("direct", "flow", "planned", "plain")


async def measure(folder: Path, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    rounds, batch = (4, 64) if args.quick else (10, 64)
    found: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    # Warm the server and both runners with one run each, not measured.
    spec = write_spec(folder, "bench-warm", 2, 8, "policy.toml")
    await flow_seconds(spec, folder / "home", folder / "runner.log")
    for deployment in PLAIN_DEPLOYMENTS.values():
        await plain_seconds(folder, -1, 2, 8, deployment)
    for rep in range(args.reps):
        turn = rep % len(SIDES)
        order = SIDES[turn:] + SIDES[:turn]  # rotate who goes first
        for side in order:
            spec = write_spec(folder, f"bench-{side}-{rep}", rounds, batch, "policy.toml")
            if side == "direct":
                found[side].append(await engine_seconds(spec, folder / "direct", function=False))
            elif side == "flow":
                found[side].append(await flow_seconds(spec, folder / "home", folder / "runner.log"))
            else:
                deployment = PLAIN_DEPLOYMENTS[side]
                found[side].append(await plain_seconds(folder, rep, rounds, batch, deployment))
        print(
            f"rep {rep}: "
            + "; ".join(f"{side} total {found[side][-1]['total']:.2f}" for side in SIDES),
            flush=True,
        )
    print(f"\n{rounds} rounds x {batch} candidates, awk simulation, medians of {args.reps}")
    return found


def print_table(found: dict[str, list[dict[str, Any]]]) -> None:
    def med(side: str, key: str) -> float:
        values = [r[key] for r in found[side] if key in r]
        return statistics.median(values) if values else float("nan")

    heads = ("(a) engine", "(b) our flow", "(c) plain, same", "(d) plain, random")
    print(f"   {'seconds':44} " + " ".join(f"{h:>17}" for h in heads))
    rows = (
        ("start-up: submit -> round 0 started", "startup"),
        ("per round (start -> next start)", "per_round"),
        ("  of which the batch (the simulations)", "science"),
        ("  of which the rest (non-science)", "non_science"),
        ("round 0 start -> last round checkpoint", "rounds"),
        ("end: last round -> flow run COMPLETED", "after"),
        ("total (submit -> COMPLETED; (a): rounds)", "total"),
    )
    for label, key in rows:
        print(f"   {label:44} " + " ".join(f"{med(side, key):>17.3f}" for side in SIDES))
    print(
        f"       of (b)'s start-up: submit call {med('flow', 'submit_call'):.2f}, "
        f"-> PENDING {med('flow', 'pickup'):.2f}, -> RUNNING {med('flow', 'running'):.2f}"
    )
    print("   (c): the same planner (one proposal a round) and task layout (3 tasks a round);")
    print("   (d): random candidates, one task a round. Both plain: no gate, fallback, policy,")
    print("   provenance or checkpoint.")

    def ratio(key: str, other: str) -> float:
        return med("flow", key) / med(other, key)

    for other, name in (("planned", "(c) like for like"), ("plain", "(d) random, 1 task")):
        print(
            f"   our flow / {name}: non-science per round x{ratio('non_science', other):.2f} "
            f"({(med('flow', 'non_science') - med(other, 'non_science')) * 1e3:+.0f} ms), "
            f"per round x{ratio('per_round', other):.2f}, start-up x{ratio('startup', other):.2f}, "
            f"end x{ratio('after', other):.2f}, total x{ratio('total', other):.2f}"
        )
    added = (med("flow", "per_round") - med("direct", "per_round")) * 1e3
    print(
        f"   our flow / engine alone, per round: x{ratio('per_round', 'direct'):.2f} "
        f"({added:+.0f} ms per round)"
    )


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds instead of 10")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each side")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    for variable in BLAS_THREADS:  # before numpy is imported, here and in the runners
        os.environ.setdefault(variable, "1")
    folder = Path(tempfile.mkdtemp(prefix="unattended-bench-campaign-"))
    os.chdir(folder)  # asyncflow's session folders land here, not in the checkout

    from flows._prefect._runner import RUNNER_QUERY_SECONDS
    from flows._prefect._server import stop_server

    print(f"load average (1, 5, 15 min) at the start: {load()} on {os.cpu_count()} CPUs")
    config, ours = serve_ours(folder)
    print(f"both runners poll every {max(1, int(RUNNER_QUERY_SECONDS))} s")
    # The same poll interval as our runner: like with like (Prefect's default is 10 s).
    plain = start_process(
        [sys.executable, "-c", PLAIN_RUNNER, str(DATA)],
        {**os.environ, "PREFECT_RUNNER_POLL_FREQUENCY": str(max(1, int(RUNNER_QUERY_SECONDS)))},
        folder / "plain-runner.log",
    )
    try:
        wait_for_line(folder / "runner.log", "serving campaign runs")
        wait_for_line(folder / "plain-runner.log", "plain-planned-rounds/planned")
        print_table(asyncio.run(measure(folder, args)))
        print(f"load average (1, 5, 15 min) at the end: {load()}")
    finally:
        stop_runner(ours)  # before the server: the other order hangs for minutes
        stop_runner(plain)
        stop_server(config)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
