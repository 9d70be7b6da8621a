"""What a campaign's allocations must show however many it needed (importable helpers).

A busy machine starts pilots and workers late: a campaign sized for one
allocation may meet the walltime and go on in a second. Tests here assert what
holds either way: at least one allocation, one after another (no two windows
overlap), every one but the last ended by the scheduler for a reason the test
expects (``timeout`` by default), the last let go by the campaign, every task
result in one of them, and every candidate done exactly once.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections import Counter
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple


class Window(NamedTuple):
    """One allocation as the provenance holds it."""

    job_id: str
    end_reason: str | None
    started_at: datetime | None
    ended_at: datetime | None


def _moment(text: Any) -> datetime | None:
    return None if text is None else datetime.fromisoformat(str(text))


def _rows(database: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        return connection.execute(query).fetchall()


def assert_allocations_follow_one_another(
    database: Path,
    *,
    between: Collection[str] = ("timeout",),
    last: Collection[str] = ("released", "completed"),
) -> list[Window]:
    """Assert the campaign's allocations ran one after another; return them in order.

    Args:
        database: the campaign's ``provenance.db``.
        between: the end reasons allowed for every allocation but the last one.
        last: the end reasons allowed for the last one.
    """
    windows = [
        Window(str(job), reason, _moment(start), _moment(end))
        for job, reason, start, end in _rows(
            database,
            "SELECT job_id, end_reason, started_at, ended_at FROM allocation "
            "ORDER BY request, requested_at",
        )
    ]
    assert windows, "the campaign recorded no allocation"
    for window in windows[:-1]:
        assert window.end_reason in between, windows
    assert windows[-1].end_reason in last, windows
    started = [w for w in windows if w.started_at is not None]
    for earlier, later in itertools.pairwise(started):
        assert earlier.ended_at is not None, windows
        # Slurm reports whole seconds; a job starts after the one before it ended.
        assert later.started_at is not None
        assert later.started_at >= earlier.ended_at, windows
    # A task interrupted before it started names no job (issue 43).
    results = {job for (job,) in _rows(database, "SELECT DISTINCT job_id FROM task_result")}
    assert results - {None} <= {w.job_id for w in windows}, (results, windows)
    return windows


def assert_each_candidate_done_once(database: Path, *, rounds: int, batch_size: int) -> None:
    """Assert each candidate of each round has exactly one ``done`` result, the rest interrupted.

    A candidate cut by the end of an allocation has an ``interrupted`` result in
    that job and runs again in a relaunch batch (numbered within it) in the next one,
    so candidates are told apart by their values, not their index.
    """
    results = _rows(
        database,
        "SELECT b.round_index, t.candidate, t.status FROM task_result t "
        "JOIN batch b ON b.id = t.batch_id",
    )
    assert {status for *_, status in results} <= {"done", "interrupted"}, results
    done = Counter((round_, candidate) for round_, candidate, status in results if status == "done")
    per_round = Counter(round_ for round_, _ in done)
    assert per_round == dict.fromkeys(range(rounds), batch_size), per_round
    assert max(done.values()) == 1, done
    cut = {(round_, candidate) for round_, candidate, status in results if status != "done"}
    assert cut <= set(done), "an interrupted candidate was never done"


def assert_end_reasons_as_slurm_says(database: Path, jobcomp: Path) -> None:
    """Assert each allocation the scheduler ended is recorded with the end Slurm logged for it.

    ``jobcomp`` is the cluster's ``jobcomp/filetxt`` log, Slurm's own record of how
    each job ended. Jobs the campaign let go (``released``) are its own word, not
    Slurm's (which logs them ``CANCELLED``, maybe a moment after the campaign ended).
    """
    from tasks._slurm import end_reason, read_jobcomp

    for job, reason in _rows(database, "SELECT job_id, end_reason FROM allocation"):
        if reason == "released":
            continue
        logged = read_jobcomp(jobcomp, str(job))
        assert logged is not None, f"Slurm logged no end for job {job} (recorded {reason})"
        assert reason == end_reason(logged.state), (job, reason, logged.state)
