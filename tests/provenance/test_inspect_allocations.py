"""The allocation story offline: ``inspect NAME --allocations``, ``--round N`` and ``export``.

The provenance is written through the store's own API (allocations as the
executor hands them over, task results naming their job), then read back by the
real CLI from the state directory, as a user would after the allocation ended.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from flows._cli import main
from flows._provenance import ProvenanceStore
from tasks import AllocationRecord, TaskResult

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC, in the past: open jobs are charged to now
HOUR = 3600.0


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def _result(index: int, status: str, job: str | None) -> TaskResult:
    return TaskResult(
        index=index,
        key=f"k/{index}",
        status=status,  # type: ignore[arg-type]  # the literal is checked by pydantic
        value={"value": float(index)} if status == "done" else None,
        runtime=1.0,
        host="node1",
        job_id=job,
        attempts=1,
        error_code="allocation_ended" if status == "interrupted" else None,
    )


# Two requests: job 101 (2 nodes) timed out after its hour, interrupting one task;
# job 102 (1 node) was cancelled still queued; job 103 was asked for with 102 and ran
# 30 minutes before the campaign released it.
JOBS = [
    AllocationRecord(
        job_id="101",
        request=1,
        requested_at=T0 - 60,
        state="TIMEOUT",
        reason="TimeLimit",
        nodes=("n1", "n2"),
        node_count=2,
        started_at=T0,
        ends_at=T0 + HOUR,
        ended_at=T0 + HOUR,
        end_reason="timeout",
    ),
    AllocationRecord(
        job_id="102",
        request=2,
        requested_at=T0 + HOUR,
        state="CANCELLED",
        end_reason="cancelled",
    ),
    AllocationRecord(
        job_id="103",
        request=2,
        requested_at=T0 + HOUR,
        state="COMPLETED",
        nodes=("n3",),
        node_count=1,
        started_at=T0 + HOUR + 10,
        ends_at=T0 + 2 * HOUR + 10,
        ended_at=T0 + HOUR + 10 + 1800,
        end_reason="released",
    ),
]
CHARGED = {"101": 2.0, "102": 0.0, "103": 0.5}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a state directory with campaign 'slurmy': one round over three jobs."""
    home = tmp_path / "state"
    with ProvenanceStore.open(home / "campaigns" / "slurmy") as store:
        store.ensure_campaign("slurmy", spec={}, site="slurm-local", seed=1, code_version="t")
        store.start_round("slurmy", 0)
        store.record_allocations("slurmy", JOBS)
        first, relaunch = "slurmy/0/a", "slurmy/0/b"
        store.record_batch_launched(
            first, campaign="slurmy", round_index=0, candidates=[[0.1], [0.2]], backend="dask"
        )
        store.record_batch_results(
            first, [_result(0, "done", "101"), _result(1, "interrupted", "101")]
        )
        store.record_batch_launched(
            relaunch, campaign="slurmy", round_index=0, candidates=[[0.2]], backend="dask"
        )
        store.record_batch_results(relaunch, [_result(0, "done", "103")])
    monkeypatch.setenv("UNATTENDED_HOME", str(home))
    return home


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestInspectAllocations:
    def test_json_lists_each_job_as_recorded_with_node_hours_and_tasks(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "inspect", "slurmy", "--allocations", "--json")
        assert code == 0
        view = json.loads(out)
        jobs = {job["job_id"]: job for job in view["allocations"]}
        assert list(jobs) == ["101", "102", "103"]
        assert [(j["state"], j["end_reason"]) for j in jobs.values()] == [
            ("TIMEOUT", "timeout"),
            ("CANCELLED", "cancelled"),
            ("COMPLETED", "released"),
        ]
        assert {k: pytest.approx(j["node_hours"]) for k, j in jobs.items()} == CHARGED
        assert [j["walltime_seconds"] for j in jobs.values()] == [HOUR, None, HOUR]
        assert [(j["tasks"], j["done"], j["interrupted"]) for j in jobs.values()] == [
            (2, 1, 1),
            (0, 0, 0),
            (1, 1, 0),
        ]
        assert jobs["101"]["started_at"] == _iso(T0)
        assert jobs["103"]["ended_at"] == _iso(T0 + HOUR + 1810)

    def test_the_totals_are_what_the_budget_counts(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, out, _ = _run(capsys, "inspect", "slurmy", "--allocations", "--json")
        totals = json.loads(out)["totals"]
        with ProvenanceStore.open(state / "campaigns" / "slurmy") as store:
            usage = store.allocation_usage("slurmy")
        assert (totals["requests"], totals["node_hours"]) == (usage.requests, usage.node_hours)
        assert totals == {
            "requests": 2,
            "jobs": 3,
            "node_hours": pytest.approx(2.5),
            "tasks": 3,
            "tasks_outside": 0,
        }

    def test_the_table_shows_end_reasons_times_walltime_and_a_total_line(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "inspect", "slurmy", "--allocations", "--wide")
        assert code == 0
        line = next(row for row in out.splitlines() if "101" in row)
        for cell in ("TIMEOUT (TimeLimit)", "timeout", "2023-11-14 22:13:20Z", "1:00:00"):
            assert cell in line
        assert "2 (n1, n2)" in line
        assert "2.0000" in line
        assert line.replace(" ", "").endswith("│2│1│")  # tasks, of which interrupted
        assert "Total: 2 allocation request(s), 3 job(s), 2.5000 node-hours charged" in out

    @pytest.mark.parametrize("argv", [["--allocations"], ["--round", "0"]])
    def test_fits_a_100_column_terminal_by_default(
        self, argv: list[str], state: Path, widest_inspect_line: Any
    ) -> None:
        assert widest_inspect_line("slurmy", *argv) <= 100

    def test_a_job_still_open_is_charged_up_to_its_planned_end(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A crashed run's job: the budget charges it until its planned end (long past here)."""
        open_job = AllocationRecord(
            job_id="104",
            request=3,
            requested_at=T0 + 3 * HOUR,
            state="RUNNING",
            nodes=("n4",),
            node_count=1,
            started_at=T0 + 3 * HOUR,
            ends_at=T0 + 3.25 * HOUR,
        )
        with ProvenanceStore.open(state / "campaigns" / "slurmy") as store:
            store.record_allocations("slurmy", [open_job])
        _, out, _ = _run(capsys, "inspect", "slurmy", "--allocations", "--json")
        view = json.loads(out)
        assert view["allocations"][-1]["node_hours"] == pytest.approx(0.25)
        assert view["totals"]["node_hours"] == pytest.approx(2.75)
        _, text, _ = _run(capsys, "inspect", "slurmy", "--allocations", "--wide")
        assert "2023-11-15 01:28:20Z planned" in text

    def test_a_campaign_without_allocations_has_an_empty_list(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        db = tmp_path / "local"
        with ProvenanceStore.open(db) as store:
            store.ensure_campaign("here", spec={}, site="local", seed=1, code_version="t")
        code, out, _ = _run(capsys, "inspect", "here", "--allocations", "--json", "--db", str(db))
        assert code == 0
        assert json.loads(out)["allocations"] == []
        code, out, _ = _run(capsys, "inspect", "here", "--allocations", "--db", str(db))
        assert "Total: 0 allocation request(s), 0 job(s)" in out

    @pytest.mark.parametrize(
        "argv",
        [["--allocations"], ["slurmy", "--allocations", "--round", "0"]],
        ids=["no-campaign", "with-round"],
    )
    def test_allocations_needs_a_campaign_and_no_round(
        self, state: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
    ) -> None:
        code, _, err = _run(capsys, "inspect", *argv)
        assert code == 2
        assert err == "error: --allocations needs a CAMPAIGN and no --round\n"

    def test_an_unknown_campaign_is_one_line_and_exit_2(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        db = str(state / "campaigns" / "slurmy")
        code, _, err = _run(capsys, "inspect", "nobody", "--allocations", "--db", db)
        assert code == 2
        assert err.count("\n") == 1
        assert "'nobody'" in err


class TestOnEachDatabase:
    def test_the_view_reads_the_same_on_sqlite_and_postgresql(
        self, store: Any, db_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--db`` with a campaign directory reads SQLite with the stdlib; a URL the full store."""
        store.ensure_campaign("slurmy", spec={}, site="slurm-local", seed=1, code_version="t")
        store.record_allocations("slurmy", JOBS)
        store.record_batch_launched(
            "b", campaign="slurmy", round_index=0, candidates=[[0.1]], backend="dask"
        )
        store.record_batch_results("b", [_result(0, "interrupted", "101")])
        code, out, _ = _run(capsys, "inspect", "slurmy", "--allocations", "--json", "--db", db_url)
        assert code == 0
        view = json.loads(out)
        assert [(j["job_id"], j["tasks"], j["interrupted"]) for j in view["allocations"]] == [
            ("101", 1, 1),
            ("102", 0, 0),
            ("103", 0, 0),
        ]
        assert view["totals"]["node_hours"] == pytest.approx(2.5)


class TestRoundShowsJobs:
    def test_each_task_shows_its_job_and_window(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "inspect", "slurmy", "--round", "0", "--wide")
        assert code == 0
        window = "2023-11-14 22:13:20Z .. 2023-11-14 23:13:20Z"
        rows = [row for row in out.splitlines() if window in row]
        assert len(rows) == 2
        assert all(" 101 " in row for row in rows)
        assert any("2023-11-14 23:13:30Z .. 2023-11-15 00:13:30Z" in r for r in out.splitlines())

    def test_the_json_round_carries_job_and_window(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, out, _ = _run(capsys, "inspect", "slurmy", "--round", "0", "--json")
        relaunch = json.loads(out)["batches"][1]["results"][0]
        assert (relaunch["job_id"], relaunch["allocation_start"], relaunch["allocation_end"]) == (
            "103",
            _iso(T0 + HOUR + 10),
            _iso(T0 + 2 * HOUR + 10),
        )


class TestExportAllocations:
    def test_jsonl_has_one_allocation_record_per_job(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(capsys, "export", "slurmy", "--format", "jsonl")
        assert code == 0
        records = [json.loads(line) for line in out.splitlines()]
        allocations = [r for r in records if r["kind"] == "allocation"]
        assert [(a["job_id"], a["request"], a["end_reason"]) for a in allocations] == [
            ("101", 1, "timeout"),
            ("102", 2, "cancelled"),
            ("103", 2, "released"),
        ]
        assert allocations[0]["nodes"] == ["n1", "n2"]
        assert allocations[0]["ended_at"] == _iso(T0 + HOUR)

    def test_csv_of_allocations_is_one_row_per_job(
        self, state: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = _run(
            capsys, "export", "slurmy", "--format", "csv", "--records", "allocations"
        )
        assert code == 0
        rows = list(csv.DictReader(io.StringIO(out)))
        assert [(r["job_id"], r["state"], r["end_reason"], r["node_count"]) for r in rows] == [
            ("101", "TIMEOUT", "timeout", "2"),
            ("102", "CANCELLED", "cancelled", "0"),
            ("103", "COMPLETED", "released", "1"),
        ]
        assert json.loads(rows[0]["nodes"]) == ["n1", "n2"]

    @pytest.mark.parametrize("records", ["allocations", "task_results"])
    def test_a_campaign_without_such_records_exports_nothing_without_a_traceback(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], records: str
    ) -> None:
        db = tmp_path / "local"
        with ProvenanceStore.open(db) as store:
            store.ensure_campaign("here", spec={}, site="local", seed=1, code_version="t")
        target = tmp_path / "out.csv"
        argv = ["export", "here", "--format", "csv", "--records", records, "--db", str(db)]
        code, _, err = _run(capsys, *argv, "--output", str(target))
        assert (code, err) == (0, "")
        assert target.read_text() == ""
