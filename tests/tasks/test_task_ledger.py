"""The task ledger's started markers: one journal line per start, read incrementally.

The Slurm tests (tests/slurm/test_login_node_death.py, test_records_on_slurm.py) use
the ledger end to end; these pin what they rely on without a cluster.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tasks._task_ledger import TaskLedger, TaskRef, jobs_with_open_tasks, started_markers
from tasks._task_supervisor import journal_name, mark_started


def _marker(key: str, token: str, attempt: int, at: float, job: str = "7") -> dict[str, object]:
    return {"key": key, "token": token, "attempt": attempt, "started_at": at,
            "job_id": job, "node": "n1", "host": "h1", "pid": 1}  # fmt: skip


def test_every_start_of_many_threads_is_one_whole_line(tmp_path: Path) -> None:
    ledger = TaskLedger(tmp_path, "run-a")
    refs = [ledger.ref(f"c/0/{i}", 1) for i in range(200)]

    def start(ref: TaskRef) -> None:
        mark_started(ref.folder, ref.digest, _marker(ref.key, "run-a", 1, 1.0))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(start, refs))
    lines = (tmp_path / journal_name("h1")).read_text().splitlines()
    assert len(lines) == 200
    assert all(ledger.started_by(r) is not None for r in refs)


def test_a_start_is_found_by_its_own_attempt_and_run(tmp_path: Path) -> None:
    ledger = TaskLedger(tmp_path, "run-b")
    first, second = ledger.ref("c/1/0", 1), ledger.ref("c/1/0", 2)
    mark_started(str(tmp_path), first.digest, _marker("c/1/0", "run-b", 1, 1.0, job="7"))
    assert ledger.started_by(first) is not None
    assert ledger.started_by(second) is None  # the retry has not started yet
    mark_started(str(tmp_path), second.digest, _marker("c/1/0", "run-b", 2, 2.0, job="8"))
    # Read incrementally: the second line is seen, and the first attempt keeps its own job.
    assert ledger.started_by(second)["job_id"] == "8"  # type: ignore[index]
    assert ledger.started_by(first)["job_id"] == "7"  # type: ignore[index]
    # A continuation sees the latest start of another run, not its own.
    later = TaskLedger(tmp_path, "run-c")
    assert [m["job_id"] for m in later.started_elsewhere("c/1/0")] == ["8"]
    assert ledger.started_elsewhere("c/1/0") == []


def test_a_line_cut_short_by_a_crash_costs_only_itself(tmp_path: Path) -> None:
    ledger = TaskLedger(tmp_path, "run-d")
    cut, whole = ledger.ref("c/2/0", 1), ledger.ref("c/2/1", 1)
    journal = tmp_path / journal_name("h1")
    journal.write_bytes(b'{"digest":"' + cut.digest.encode() + b'","key":"c/2')  # no newline
    mark_started(str(tmp_path), whole.digest, _marker("c/2/1", "run-d", 1, 3.0))
    assert ledger.started_by(whole) is not None
    assert ledger.started_by(cut) is None


def test_open_tasks_name_their_jobs_until_their_result_is_written(tmp_path: Path) -> None:
    ref = TaskLedger(tmp_path, "run-e").ref("c/3/0", 1)
    # Written by another process, as a task's supervisor on the allocation does.
    code = (
        "import sys; from tasks._task_supervisor import mark_started; "
        "mark_started(sys.argv[1], sys.argv[2], {'key': 'c/3/0', 'token': 'run-e', "
        "'attempt': 1, 'started_at': 1.0, 'job_id': '42', 'node': 'n2', 'host': 'h2', 'pid': 5})"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path), ref.digest], check=True)
    assert started_markers(tmp_path)[ref.digest]["node"] == "n2"
    assert jobs_with_open_tasks(tmp_path) == {"42"}
    (tmp_path / f"{ref.digest}.result").write_text("{}")
    assert jobs_with_open_tasks(tmp_path) == set()
