"""How fast the provenance store records and reads, at campaign scale.

Measured in one run, on a fresh SQLite file (and PostgreSQL with ``--pg URL``):

* recording 100,000 attempts with verdicts the way the gate writes them (per gate
  call of 3 attempts: ``record_gate_call``, one ``record_attempt`` transaction per
  attempt, ``finish_gate_call``) beside the bulk figure (``record_attempts``, 1,000
  per gate call; what an import or a replay would do, not the gate),
* a campaign summary over a database with 1,000,000 attempts (built with bulk
  inserts), in-process and as ``unattended inspect NAME`` in a fresh process,
* one round's full view (``round_view``; ``unattended inspect NAME --round N``),
* ``unattended inspect --help`` in a fresh process.

    python benchmarks/provenance.py [--quick] [--pg postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acceptance import Attempt, Verdict
from flows._provenance import ProvenanceStore
from flows._provenance._schema import AttemptRow, table

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "import sys; from flows._cli import main; sys.exit(main())"]


def _attempt(number: int) -> Attempt[Any]:
    accepted = number % 4 == 0
    return Attempt(
        number=number,
        value={"x": [0.1 * (number % 10), 0.5], "batch": 16},
        rejected_by=None if accepted else "bounds",
        reason=None if accepted else "x[0] above the upper bound 1.0",
        verdicts=(
            Verdict("schema", True, None, 0.0001),
            Verdict("bounds", accepted, None if accepted else "x[0] above 1.0", 0.0002),
            Verdict("verifier", accepted, None, 0.01),
        ),
        scores={"novelty": 0.5, "diversity": 0.25},
        duration=0.02,
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
    )


def _best(repeat: int, work: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def _cli_seconds(args: list[str], repeat: int = 3) -> float:
    def run() -> None:
        subprocess.run([*CLI, *args], check=True, capture_output=True, cwd=ROOT, timeout=120)

    return _best(repeat, run)


def bench_record(url: str, attempts: int, per_call: int = 3) -> None:
    """Print the recording rates: as the gate writes attempts, and in bulk."""
    with ProvenanceStore.open(url) as store:
        store.ensure_campaign("rec", spec={}, site="local", seed=1, code_version="bench")
        # As the gate writes: a gate call, each attempt in its own transaction as it
        # is judged (flows._engine._round), then the call's disposition.
        start = time.perf_counter()
        cpu_start = time.process_time()
        for call_index in range(attempts // per_call):
            call = store.record_gate_call(
                "rec",
                call_index // 100,
                call_index % 100,
                gate="planner",
                budget=per_call,
                fallback_hash="h",
                fallback_value=[0.5],
            )
            for number in range(1, per_call + 1):
                store.record_attempt(call, _attempt(number))
            store.finish_gate_call(call, "accepted", per_call)
        gate = time.perf_counter() - start
        gate_cpu = time.process_time() - cpu_start
        written = attempts // per_call * per_call
        batch = [_attempt(n) for n in range(1, 1001)]
        start = time.perf_counter()
        for call_index in range(attempts // 1000):
            call = store.record_gate_call(
                "rec",
                10**6 + call_index // 10,
                call_index % 10,
                gate="planner",
                budget=1000,
                fallback_hash="h",
                fallback_value=[0.5],
            )
            store.record_attempts(call, batch)
            store.finish_gate_call(call, "accepted", 1000)
        bulk = time.perf_counter() - start
    print(
        f"  record {written:,} attempts as the gate does ({per_call} per gate call, one "
        f"transaction each): {gate:8.2f} s ({gate / written * 1e3:.3f} ms per attempt, "
        f"{gate_cpu:.2f} s CPU here)"
    )
    print(
        f"  record {attempts:,} attempts in bulk (1,000 per transaction):       {bulk:8.2f} s "
        f"({bulk / attempts * 1e3:.4f} ms per attempt; the gate's way is x{gate / bulk:.0f})"
    )


def build_large(url: str, rounds: int, calls: int, per_call: int, tasks: int) -> None:
    """Fill campaign 'big' with rounds x calls x per_call attempts, via bulk inserts."""
    from flows._provenance._rows import jsonable

    template = jsonable(_attempt(1).model_dump(mode="json"))
    accepted = {**jsonable(_attempt(4).model_dump(mode="json"))}
    with ProvenanceStore.open(url) as store:
        store.ensure_campaign(
            "big", spec={"rounds": rounds}, site="local", seed=1, code_version="bench"
        )
        attempts_table = table(AttemptRow)
        for index in range(rounds):
            rows: list[dict[str, Any]] = []
            for call_index in range(calls):
                call = store.record_gate_call(
                    "big",
                    index,
                    call_index,
                    gate="planner",
                    budget=per_call,
                    fallback_hash=f"h{index}",
                    fallback_value=[0.5, 0.5],
                )
                for number in range(1, per_call + 1):
                    source = accepted if number == per_call else template
                    rows.append({**source, "number": number, "gate_call_id": call})
                store.finish_gate_call(call, "accepted", per_call)
            with store.engine.begin() as connection:
                connection.execute(attempts_table.insert(), rows)
            store.record_decision("big", index, 0, {"outcome": "continue", "reason": "ok"})
            key = f"big-{index}"
            store.record_batch_launched(
                key,
                campaign="big",
                round_index=index,
                candidates=[[i / tasks] for i in range(tasks)],
                backend="local",
            )
            store.record_batch_results(
                key,
                [
                    {
                        "index": i,
                        "key": f"{key}-{i}",
                        "status": "done",
                        "value": ((i - index % tasks) ** 2) / tasks + 1,
                        "runtime": 1.0,
                        "host": "n",
                        "exit_code": 0,
                        "stderr_tail": "",
                        "attempts": 1,
                        "error_code": None,
                        "retries": [],
                    }
                    for i in range(tasks)
                ],
            )
            store.checkpoint_round(
                "big",
                index,
                surrogate_state={"n": index},
                policy_state={},
                planner_state={},
                status="completed",
            )


def bench_read(url: str, rounds: int, cli: bool) -> None:
    """Print the summary and round-view times."""
    middle = rounds // 2
    with ProvenanceStore.open(url, read_only=True) as store:
        summary = _best(5, lambda: store.summary("big"))
        view = _best(5, lambda: store.round_view("big", middle))
        total = store.summary("big")["totals"]["attempts"]
    print(f"  campaign summary over {total:,} attempts: {summary * 1e3:8.1f} ms (in-process)")
    print(f"  one round's full view:                  {view * 1e3:8.1f} ms (in-process)")
    if cli:
        summary_cli = _cli_seconds(["inspect", "big", "--db", url])
        print(f"  `unattended inspect big` (new process): {summary_cli:8.3f} s")
        print(
            f"  `unattended inspect big --round {middle}`:   "
            f"{_cli_seconds(['inspect', 'big', '--round', str(middle), '--db', url]):8.3f} s"
        )


def main() -> None:
    """Run every measurement and print the figures, with the load average."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--pg", metavar="URL", help="also measure an (empty) PostgreSQL database")
    args = parser.parse_args()
    attempts = 10_002 if args.quick else 100_002  # a multiple of 3 (attempts per gate call)
    rounds, calls, per_call, tasks = (20, 2, 250, 16) if args.quick else (1000, 2, 500, 16)
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory() as scratch:
        targets = [("SQLite", str(Path(scratch) / "rec.db"), str(Path(scratch) / "big.db"))]
        if args.pg:
            targets.append(("PostgreSQL", args.pg, args.pg))
        for label, record_url, big_url in targets:
            print(f"{label}:")
            bench_record(record_url, attempts)
            start = time.perf_counter()
            build_large(big_url, rounds, calls, per_call, tasks)
            print(
                f"  built {rounds * calls * per_call:,} attempts in "
                f"{time.perf_counter() - start:.1f} s"
            )
            bench_read(big_url, rounds, cli=True)
    print(
        f"`unattended inspect --help` (new process): {_cli_seconds(['inspect', '--help'], 5):.3f} s"
    )
    print(
        f"`python -c pass` (interpreter start):      "
        f"{_best(5, lambda: subprocess.run([sys.executable, '-c', 'pass'], check=True)):.3f} s"
    )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    os.sync()


if __name__ == "__main__":
    main()
