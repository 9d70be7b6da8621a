"""``run``'s lines when an allocation ends under a batch: interrupted, then relaunched.

Read from a real provenance database the way ``follow`` reads it: an 8-task batch whose
job ended with 5 tasks unfinished is still an 8-task batch; the follower says how many
were interrupted, by which job's end, and which job ran them again.
"""

from __future__ import annotations

from pathlib import Path

from flows._cli._progress import progress_lines, read_progress
from flows._provenance import ProvenanceStore
from tasks import TaskResult

CAMPAIGN = "cut"


def result(index: int, status: str, job: str) -> TaskResult:
    return TaskResult(
        index=index,
        key=f"k{job}-{index}",
        status=status,  # type: ignore[arg-type]  # a literal from the test's table
        value={"value": 1.0} if status == "done" else None,
        runtime=0.1,
        host="n1",
        attempts=1,
        job_id=job,
    )


def job(job_id: str, request: int, end_reason: str | None) -> dict[str, object]:
    return {
        "job_id": job_id,
        "request": request,
        "state": "CANCELLED" if end_reason else "RUNNING",
        "reason": None,
        "nodes": ["n1"],
        "node_count": 1,
        "requested_at": 1_780_000_000.0,
        "started_at": 1_780_000_001.0,
        "ends_at": 1_780_003_600.0,
        "ended_at": 1_780_000_100.0 if end_reason else None,
        "end_reason": end_reason,
    }


def lines_now(folder: Path) -> list[str]:
    reader = ProvenanceStore.open(folder, read_only=True)
    try:
        return [line for r in read_progress(reader, CAMPAIGN) for line in progress_lines(r)]
    finally:
        reader.close()


def test_an_interrupted_batch_says_what_was_cut_and_where_it_ran_again(tmp_path: Path) -> None:
    writer = ProvenanceStore.open(tmp_path)
    writer.ensure_campaign(CAMPAIGN, spec={}, site="slurm", seed=1, code_version="test")
    writer.start_round(CAMPAIGN, 0)
    writer.record_decision(CAMPAIGN, 0, 1, {"outcome": "continue"})
    candidates = [[0.1 * i] for i in range(8)]
    writer.record_batch_launched(
        "b0", campaign=CAMPAIGN, round_index=0, candidates=candidates, backend="dask"
    )
    writer.record_allocations(CAMPAIGN, [job("123", 1, "cancelled")])
    cut = [result(i, "done" if i < 3 else "interrupted", "123") for i in range(8)]
    writer.record_batch_results("b0", cut)

    shown = lines_now(tmp_path)
    assert "round 0: batch of 8 task(s) launched" in shown  # not "3": the batch's size
    assert (
        "round 0: 5 task(s) interrupted (job 123 ended: cancelled); relaunching in a new allocation"
    ) in shown
    assert not any("batch finished" in line for line in shown)  # 5 have no result yet

    writer.record_allocations(CAMPAIGN, [job("124", 2, None)])
    writer.record_batch_launched(
        "b0r1", campaign=CAMPAIGN, round_index=0, candidates=candidates[3:], backend="dask",
        relaunch=1,
    )  # fmt: skip
    writer.record_batch_results("b0r1", [result(i, "done", "124") for i in range(5)])
    writer.close()

    shown = lines_now(tmp_path)
    assert (
        "round 0: 5 task(s) interrupted (job 123 ended: cancelled); relaunched in job 124"
    ) in shown
    assert "round 0: batch finished: 8 done, 0 failed" in shown
    assert "round 0: batch of 8 task(s) launched" in shown


def test_a_batch_nothing_cut_says_nothing_of_interruptions(tmp_path: Path) -> None:
    writer = ProvenanceStore.open(tmp_path)
    writer.ensure_campaign(CAMPAIGN, spec={}, site="slurm", seed=1, code_version="test")
    writer.start_round(CAMPAIGN, 0)
    writer.record_decision(CAMPAIGN, 0, 1, {"outcome": "continue"})
    writer.record_batch_launched(
        "b0", campaign=CAMPAIGN, round_index=0, candidates=[[0.1], [0.2]], backend="dask"
    )
    writer.record_batch_results("b0", [result(0, "done", "7"), result(1, "failed", "7")])
    writer.close()

    shown = lines_now(tmp_path)
    assert "round 0: batch finished: 1 done, 1 failed" in shown
    assert not any("interrupted" in line for line in shown)
