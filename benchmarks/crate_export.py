"""How long ``export --format ro-crate`` and ``--format prov`` take, and their peak memory.

For each size (10,000 and 100,000 attempts by default) a SQLite campaign is written
through the store's own writers: rounds of 1,000 attempts (``record_attempts``, each
with a verifier verdict), a policy decision, a batch of 8 simulation tasks and a
checkpoint per round. Each export then runs in a fresh process (the CLI), which
reports its own peak RSS (``ru_maxrss``), so the figures are side by side in one run:
memory should stay flat as the attempts grow tenfold.

``--in-memory`` adds, for comparison, what ``rocrate`` alone would hold: the same
attempt entities added to one ``ROCrate`` and its metadata generated as one document
(how ``ROCrate.write`` works), measured the same way.

    python benchmarks/crate_export.py [--sizes 10000 100000] [--in-memory]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from acceptance import Attempt, Verdict
from flows._provenance import ProvenanceStore

ROOT = Path(__file__).resolve().parent.parent
PER_ROUND = 1000
MEASURED_CLI = (
    "import resource, sys\n"
    "from flows._cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(code)\n"
)
IN_MEMORY = """
import json, resource, sys
from rocrate.model import ContextEntity
from rocrate.rocrate import ROCrate
crate = ROCrate(gen_preview=False, version="1.1")
for n in range(int(sys.argv[1])):
    own = f"#round-{n // 1000}/call-1/attempt-{n % 1000 + 1}"
    crate.add(ContextEntity(crate, own, properties={"@type": "CreateAction", "name": own,
        "instrument": {"@id": "#tool/planner"}, "result": {"@id": own + "/proposal"}}))
    crate.add(ContextEntity(crate, own + "/proposal", properties={"@type": "PropertyValue",
        "name": "proposal", "value": json.dumps({"x": [0.1, 0.5], "batch": 16})}))
    crate.add(ContextEntity(crate, "#control/" + own[1:], properties={"@type": "ControlAction",
        "instrument": {"@id": "#step/attempt"}, "object": {"@id": own}}))
text = json.dumps(crate.metadata.generate())
print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


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
        scores={"novelty": 0.5},
        duration=0.02,
    )


def build(database: Path, name: str, attempts: int) -> None:
    """Write a campaign of ``attempts`` attempts through the store's writers."""
    batch = [_attempt(n) for n in range(1, PER_ROUND + 1)]
    with ProvenanceStore.open(database) as store:
        store.ensure_campaign(name, spec={"name": name}, site="local", seed=1, code_version="b")
        for index in range(attempts // PER_ROUND):
            store.start_round(name, index)
            call = store.record_gate_call(
                name, index, 1, gate="planner", budget=PER_ROUND, fallback_hash="h",
                fallback_value=[0.5],
            )  # fmt: skip
            store.record_attempts(call, batch)
            store.finish_gate_call(call, "accepted", attempts_used=PER_ROUND)
            store.record_decision(name, index, 1, {"outcome": "continue", "reason": ""})
            key = f"{name}-batch-{index}"
            candidates = [[0.1 * i, 0.5] for i in range(8)]
            store.record_batch_launched(
                key, campaign=name, round_index=index, candidates=candidates, backend="local"
            )
            store.record_batch_results(
                key,
                [
                    {"index": i, "key": f"{key}/{i}", "status": "done", "value": {"value": 1.0 + i},
                     "runtime": 0.5, "host": "node-1", "exit_code": 0, "stderr_tail": "",
                     "attempts": 1, "error_code": None, "retries": [], "candidate": c}
                    for i, c in enumerate(candidates)
                ],
            )  # fmt: skip
            store.checkpoint_round(
                name, index, surrogate_state={}, policy_state={}, planner_state={},
                status="completed",
            )  # fmt: skip


def measured(args: list[str], cwd: Path) -> tuple[float, float]:
    """Run ``args`` in a fresh Python; return (seconds, peak RSS in MiB)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", *args], capture_output=True, text=True, cwd=cwd, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: {args[1:]}\n{done.stderr[-2000:]}")
    kib = next(
        int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("maxrss_kib")
    )
    return seconds, kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--in-memory", action="store_true", help="also measure rocrate alone")
    options = parser.parse_args()
    print(f"{'attempts':>9} {'format':>9} {'seconds':>8} {'peak MiB':>9} {'output MiB':>10}")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for size in options.sizes:
            name = f"bench{size}"
            database = work / f"{name}.db"
            start = time.perf_counter()
            build(database, name, size)
            print(f"# built {size} attempts in {time.perf_counter() - start:.1f} s", flush=True)
            for fmt, out in (("ro-crate", work / f"{name}-crate"), ("prov", work / name)):
                argv = ["export", name, "--format", fmt, "--out", str(out), "--db", str(database)]
                seconds, peak = measured([MEASURED_CLI, *argv], ROOT)
                files = (
                    [p for p in out.rglob("*") if p.is_file()]
                    if out.is_dir()
                    else [
                        out.with_name(out.name + ".prov.json"),
                        out.with_name(out.name + ".provn"),
                    ]
                )
                written = sum(p.stat().st_size for p in files)
                print(f"{size:>9} {fmt:>9} {seconds:>8.1f} {peak:>9.0f} {written / 2**20:>10.1f}",
                      flush=True)  # fmt: skip
            if options.in_memory:
                seconds, peak = measured([IN_MEMORY, str(size)], ROOT)
                print(
                    f"{size:>9} {'rocrate*':>9} {seconds:>8.1f} {peak:>9.0f} {'-':>10}", flush=True
                )
    if options.in_memory:
        print("* attempts only (3 entities each) held in one ROCrate, metadata generated at once")


if __name__ == "__main__":
    main()
