"""Where a round of our flow goes when it is not simulating: the items, in milliseconds.

``campaign.py`` says how much a round of our flow costs beside a plain Prefect flow
doing the same work; this says what the difference is made of. One real Prefect
server (SQLite, a free 127.0.0.1 port, a temporary state dir) and the campaign flow's
own code (``flows._prefect._campaign``), run in this process inside a flow so each
item can be timed: the same campaign as ``campaign.py`` (R rounds x 64 candidates, the
``awk`` simulation, the surrogate planner, a 3-rule policy). Timed around the calls
that make a round, summed per round:

- Prefect's task runs (three a round): entering a task and leaving it, apart from
  what the task runs;
- the deterministic fallback (the surrogate's batch with another seed), with the
  surrogate's hyperparameter fit and model build it does first for the new data
  (the plain flow's one proposal pays those too), and the planner's proposal;
- every provenance write, by call (each is one transaction, synced to disk);
- the run log's lines (Prefect's logger, one per round event);
- the UI's artifacts and events (``flows._prefect._artifacts``): the hook the round
  pays (queueing, ``emit_event``), and apart, the CPU the publisher's thread spends
  (provenance reads and artifact requests, off the round's path) and the wait for
  its last artifacts when the campaign ends (once, divided by the rounds); each
  repetition also runs the campaign with a hook that does nothing (alternating), and
  its non-science time is printed beside ours;
- the rest, by difference: the gate's and policy's own code, checks, and the loop.

Each campaign's items are summed and divided by its rounds; printed are medians over
``--reps`` campaigns after one warm-up, with the load average, next to the round's
non-science time measured as ``campaign.py`` does (one round's start to the next's,
less the batch).

    python benchmarks/round_breakdown.py [--rounds R] [--reps N]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import functools
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
Totals = collections.defaultdict[str, float]
# Inside the fallback (the first proposal on new data), not an item of its own.
FIT = "  of which the hyperparameter fit (the plain flow pays it too)"


def timed(owner: Any, name: str, label: str, totals: Totals) -> None:
    """Replace ``owner.name`` with a function adding its seconds (awaited too) to ``label``."""
    original = getattr(owner, name)
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def awaited(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                totals[label] += time.perf_counter() - began

        setattr(owner, name, awaited)
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - began

    setattr(owner, name, wrapper)


def instrument(totals: Totals) -> None:
    """Time the round's items in the flow's own modules (this process only)."""
    from flows._engine import _round
    from flows._prefect import _campaign
    from flows._provenance import ProvenanceStore
    from tasks import _surrogate
    from tasks._planners import _surrogate_planner

    step = _campaign._as_task

    async def as_task(name: str, fn: Callable[[], Any]) -> Any:
        kind = name.split()[0]
        began = time.perf_counter()
        inside = 0.0

        async def body() -> Any:
            nonlocal inside
            started = time.perf_counter()
            try:
                return await fn()
            finally:
                inside = time.perf_counter() - started

        try:
            return await step(name, body)
        finally:
            totals[f"Prefect task run: entering and leaving ({kind})"] += (
                time.perf_counter() - began - inside
            )

    _campaign._as_task = as_task  # type: ignore[assignment]
    logger = _campaign._event_logger

    def event_logger() -> Callable[[str, Any], None]:
        log = logger()

        def on_event(kind: str, data: Any) -> None:
            began = time.perf_counter()
            log(kind, data)
            totals["run log lines (Prefect's logger)"] += time.perf_counter() - began

        return on_event

    _campaign._event_logger = event_logger  # type: ignore[assignment]
    timed(_round, "fallback_batch", "fallback batch", totals)
    timed(_surrogate.GaussianProcess, "_hyperparameters", FIT, totals)
    timed(_surrogate_planner.SurrogatePlanner, "__call__", "planner's proposal", totals)
    for name in dir(ProvenanceStore):
        if name.startswith(("record_", "checkpoint_", "finish_", "start_round")):
            timed(ProvenanceStore, name, f"provenance write: {name}", totals)


ARTIFACTS_HOOK = "UI artifacts and events: the hook, on the round's path"
ARTIFACTS_DRAIN = "  UI artifacts: waiting for the last ones at the end (once a campaign)"
ARTIFACTS_THREAD = "  UI artifacts: CPU of their own thread (reads, requests; off the path)"
# The round's non-science time with the UI hook replaced by one that does nothing.
WITHOUT_UI = "non_science without the UI hook"


def instrument_ui(totals: Totals, ui: dict[str, bool]) -> None:
    """Time the UI hook (artifacts queued, events emitted) and its thread's CPU.

    ``ui["on"]`` says whether the next campaign gets the hook (else a hook that does
    nothing: the side-by-side comparison).
    """
    from flows._prefect import _artifacts, _campaign

    original = _artifacts.ui_observer

    def observer(campaign: str, store: Any, flow_run_id: str | None) -> Any:
        if not ui["on"]:
            return lambda kind, data: None
        hook = original(campaign, store, flow_run_id)

        def on_event(kind: str, data: Any) -> None:
            began = time.perf_counter()
            drained = totals[ARTIFACTS_DRAIN]
            hook(kind, data)
            waited = totals[ARTIFACTS_DRAIN] - drained
            totals[ARTIFACTS_HOOK] += time.perf_counter() - began - waited

        return on_event

    _campaign.ui_observer = observer  # type: ignore[assignment]
    timed(_artifacts._Publisher, "drain", ARTIFACTS_DRAIN, totals)
    for name in dir(_artifacts.CampaignArtifacts):
        if name.startswith("_publish_"):
            method = getattr(_artifacts.CampaignArtifacts, name)

            def cpu(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                began = time.thread_time()  # this thread's CPU: waiting for the GIL is not it
                try:
                    return _method(*args, **kwargs)
                finally:
                    totals[ARTIFACTS_THREAD] += time.thread_time() - began

            setattr(_artifacts.CampaignArtifacts, name, cpu)


async def one_campaign(folder: Path, name: str, rounds: int, totals: Totals) -> dict[str, float]:
    """Run one campaign through the flow's code; return its medians and item totals."""
    import campaign as bench
    from prefect import flow

    from flows._prefect import _campaign

    spec = bench.write_spec(folder, name, rounds, 64, "policy.toml")

    @flow(name="round-breakdown", persist_result=False)
    async def wrapper(spec_path: str, home: str) -> Any:
        return await _campaign._campaign(spec_path, "local", home)

    totals.clear()
    await wrapper(str(spec), str(folder / "home"))
    rows = bench.rounds_of(folder / "home", name)
    medians = bench.round_medians(
        [bench.stamp(r["started_at"]) for r in rows], [r["science"] for r in rows]
    )
    return {**medians, **{item: seconds / rounds for item, seconds in totals.items()}}


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds per campaign")
    parser.add_argument("--reps", type=int, default=3, help="campaigns measured")
    args = parser.parse_args()
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")  # as campaign.py: before numpy is imported
    sys.path.insert(0, str(HERE))
    folder = Path(tempfile.mkdtemp(prefix="unattended-bench-breakdown-"))
    os.chdir(folder)  # asyncflow's session folders land here
    # Registered before any tracer provider exists, so it runs after the provider's own
    # exit handler, which writes the campaigns' last spans into the folder again.
    atexit.register(shutil.rmtree, folder, True)

    from campaign import free_port

    from flows._prefect._server import ServerConfig, client_env, start_server, stop_server

    print(f"load average (1, 5, 15 min) at the start: {load()} on {os.cpu_count()} CPUs")
    config = ServerConfig(port=free_port(), state_dir=folder / "server")
    os.environ.update(client_env(start_server(config, timeout=180)))
    totals: Totals = collections.defaultdict(float)
    instrument(totals)
    ui = {"on": True}
    instrument_ui(totals, ui)
    try:
        asyncio.run(one_campaign(folder, "warm", 2, totals))
        found = []
        for rep in range(args.reps):
            # Side by side, alternating: a campaign without the UI hook, then one with it.
            ui["on"] = False
            without = asyncio.run(one_campaign(folder, f"bare{rep}", args.rounds, totals))
            ui["on"] = True
            found.append(asyncio.run(one_campaign(folder, f"rep{rep}", args.rounds, totals)))
            found[-1][WITHOUT_UI] = without["non_science"]
    finally:
        from prefect.logging.handlers import APILogHandler

        try:
            APILogHandler().flush()  # the run log's last lines, before the server goes
        finally:
            stop_server(config)
            shutil.rmtree(folder, ignore_errors=True)
    report(found, args)
    print(f"load average (1, 5, 15 min) at the end: {load()}")
    return 0


def report(found: list[dict[str, float]], args: argparse.Namespace) -> None:
    def ms(key: str) -> float:
        return 1e3 * statistics.median(r.get(key, 0.0) for r in found)

    print(f"\n{args.rounds} rounds x 64 candidates, medians of {args.reps} campaigns, ms a round")
    print(f"   {'round (start -> next start)':62} {ms('per_round'):8.1f}")
    print(f"   {'  the batch (the simulations)':62} {ms('science'):8.1f}")
    print(f"   {'  the rest (non-science)':62} {ms('non_science'):8.1f}")
    print(f"   {'  the rest, in the campaign run without the UI hook':62} {ms(WITHOUT_UI):8.1f}")
    apart = {"per_round", "science", "non_science", FIT, ARTIFACTS_DRAIN, ARTIFACTS_THREAD}
    apart.add(WITHOUT_UI)
    items = {k for r in found for k in r} - apart
    order = sorted(items, key=lambda k: (k.startswith("provenance"), k))
    for item in order:
        print(f"   {'    ' + item:62} {ms(item):8.1f}")
        if item == "fallback batch":
            print(f"   {'    ' + FIT:62} {ms(FIT):8.1f}")
        if item == ARTIFACTS_HOOK:
            for part in (ARTIFACTS_DRAIN, ARTIFACTS_THREAD):
                print(f"   {'    ' + part:62} {ms(part):8.1f}")
    writes = sum(ms(k) for k in items if k.startswith("provenance"))
    rest = ms("non_science") - sum(ms(k) for k in items)
    print(f"   {'    provenance writes, all':62} {writes:8.1f}")
    print(f"   {'    the rest (gate, policy, checks, the loop; by difference)':62} {rest:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
