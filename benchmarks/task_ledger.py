"""What the task ledger costs a task on its worker: the started marker, and a durable result.

Every task on an allocation reports its start to the campaign's ``task-results``
folder (``tasks/_task_ledger.py``); a simulation batch's tasks also write their
result, fsync'd. This times the worker-side wrapper (``tasks._dispatch._call_recorded``)
around a trivial function, for this checkout and, with ``--before REF``, another
version (a commit or a directory), in subprocesses alternated A B A B, and prints
medians with the load average. The folder is made under ``--dir`` (default: the
checkout's parent), since the disk is what is measured.

    python benchmarks/task_ledger.py [--before REF] [--reps 3] [--tasks 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _before import checkout, describe  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, operator, shutil, sys, tempfile, time
import tasks._dispatch as dispatch
from tasks._task_ledger import TaskLedger

n, where = int(sys.argv[1]), sys.argv[2]
folder = tempfile.mkdtemp(dir=where)
ledger = TaskLedger(folder, "bench")
out = {}
for durable, count in ((False, n), (True, max(n // 10, 20))):
    refs = [ledger.ref(f"bench/{durable}/{i}", 1, durable=durable) for i in range(count)]
    started = time.perf_counter()
    for r in refs:
        dispatch._call_recorded(operator.add, (1, 2), {},
                                (r.folder, r.digest, r.token, r.attempt, r.key, r.durable))
    out["durable" if durable else "marker"] = (time.perf_counter() - started) / count * 1e6
shutil.rmtree(folder)
print(json.dumps(out))
"""


def _probe(code: Path, tasks: int, where: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tasks), where],
        capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a commit or a directory to compare with")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--dir", default=str(ROOT.parent), help="where the ledger folder is made")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    sides: dict[str, dict[str, list[float]]] = {}
    with checkout(args.before) if args.before else contextlib.nullcontext() as before:
        codes = {"this checkout": ROOT}
        if before is not None:
            codes[describe(args.before)] = before
        for rep in range(args.reps):
            order = list(codes.items()) if rep % 2 == 0 else list(reversed(codes.items()))
            for name, code in order:
                got = _probe(code, args.tasks, args.dir)
                for what, value in got.items():
                    sides.setdefault(name, {}).setdefault(what, []).append(value)
    for name, got in sides.items():
        print(
            f"{name}: started marker {statistics.median(got['marker']):.0f} us/task, "
            f"durable (marker + fsync'd result) {statistics.median(got['durable']):.0f} us/task "
            f"(medians of {args.reps})"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
