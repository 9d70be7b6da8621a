"""Reading Slurm's words (squeue, scontrol, jobcomp, a job's environment) without a Slurm."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest

from tasks._allocations import AllocationWatch
from tasks._slurm import (
    AllocationState,
    SlurmQueryFailed,
    describe_queue,
    end_reason,
    job_from_env,
    jobcomp_path,
    parse_scontrol,
    parse_squeue,
    read_jobcomp,
    read_squeue_answer,
)


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


class TestEndReason:
    @pytest.mark.parametrize(
        ("state", "reason"),
        [
            ("COMPLETED", "completed"),
            ("TIMEOUT", "timeout"),
            ("CANCELLED", "cancelled"),
            ("CANCELLED by 0", "cancelled"),
            ("NODE_FAIL", "node_fail"),
            ("PREEMPTED", "preempted"),
            ("FAILED", "failed"),
            ("OUT_OF_MEMORY", "failed"),
            ("SOMETHING_NEW", "unknown"),
            ("", "unknown"),
        ],
    )
    def test_each_slurm_state_has_one_end_reason(self, state: str, reason: str) -> None:
        assert end_reason(state) == reason

    def test_a_live_job_has_no_end_reason_yet(self) -> None:
        for state in ("PENDING", "RUNNING", "COMPLETING"):
            job = AllocationState(job_id="1", state=state)
            assert not job.ended
            assert job.end_reason is None


class TestSqueue:
    def test_a_running_and_a_pending_job_are_parsed(self) -> None:
        out = (
            "12|RUNNING|None|2026-01-02T10:00:00|2026-01-02T10:00:01|2026-01-02T10:01:01|node1|1\n"
            "13|PENDING|Resources|2026-01-02T10:00:05|N/A|N/A||1\n"
        )
        jobs = parse_squeue(out)
        assert jobs["12"].running
        assert jobs["12"].nodes == ("node1",)
        assert jobs["12"].started_at == epoch("2026-01-02T10:00:01")
        assert jobs["12"].ends_at == epoch("2026-01-02T10:01:01")
        assert jobs["13"].state == "PENDING"
        assert jobs["13"].started_at is None
        assert jobs["13"].describe() == "job 13 PENDING (Resources)"

    def test_an_ended_job_says_how(self) -> None:
        out = "7|TIMEOUT|TimeLimit|2026-01-02T10:00:00|2026-01-02T10:00:01|2026-01-02T10:01:25|n|1"
        job = parse_squeue(out)["7"]
        assert job.ended
        assert job.end_reason == "timeout"

    def test_lines_that_are_not_jobs_are_ignored(self) -> None:
        assert parse_squeue("slurm_load_jobs error: Invalid job id specified\n\n") == {}

    def test_the_queue_line_names_only_pending_jobs(self) -> None:
        states = [
            AllocationState(job_id="4", state="RUNNING"),
            AllocationState(job_id="5", state="PENDING", reason="Resources"),
            AllocationState(job_id="6", state="PENDING", reason="None"),
        ]
        expected = "waiting in queue: job 5 PENDING (Resources), job 6 PENDING"
        assert describe_queue(states) == expected
        assert describe_queue(states[:1]) == ""


SCONTROL = (
    "JobId=2 JobName=wrap UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
    "SubmitTime=2026-12-01T13:21:57 StartTime=2026-12-01T13:21:58 EndTime=2026-12-01T13:23:25 "
    "Partition=debug NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1"
)
JOBCOMP = (
    "JobId=1 UserId=root(0) GroupId=root(0) Name=true JobState=COMPLETED Partition=debug "
    "TimeLimit=1 StartTime=2026-12-01T13:21:56 EndTime=2026-12-01T13:21:56 NodeList=vm "
    "NodeCnt=1 ProcCnt=1\n"
    "JobId=3 UserId=root(0) GroupId=root(0) Name=dask-worker JobState=CANCELLED "
    "Partition=debug TimeLimit=1 StartTime=2026-12-01T13:22:05 EndTime=2026-12-01T13:23:25 "
    "NodeList=vm NodeCnt=1 ProcCnt=1\n"
)


class TestScontrolAndJobcomp:
    def test_scontrol_show_job_is_parsed(self) -> None:
        job = parse_scontrol(SCONTROL)
        assert job is not None
        assert (job.job_id, job.state, job.reason) == ("2", "TIMEOUT", "TimeLimit")
        assert job.end_reason == "timeout"
        assert job.nodes == ("vm",)
        assert job.node_count == 1
        assert job.ends_at == epoch("2026-12-01T13:23:25")

    def test_the_jobcomp_log_keeps_how_a_forgotten_job_ended(self, tmp_path: Path) -> None:
        log = tmp_path / "jobcomp.txt"
        log.write_text(JOBCOMP, encoding="utf-8")
        job = read_jobcomp(log, "3")
        assert job is not None
        assert job.end_reason == "cancelled"
        assert job.node_count == 1
        assert read_jobcomp(log, "99") is None
        assert read_jobcomp(tmp_path / "absent.txt", "1") is None

    def test_the_jobcomp_log_is_found_from_slurm_conf(self, tmp_path: Path) -> None:
        conf = tmp_path / "slurm.conf"
        conf.write_text(
            "JobCompType=jobcomp/filetxt  # a log\nJobCompLoc=/var/log/jobcomp.txt\n",
            encoding="utf-8",
        )
        assert jobcomp_path(conf) == Path("/var/log/jobcomp.txt")
        conf.write_text("JobCompType=jobcomp/none\n", encoding="utf-8")
        assert jobcomp_path(conf) is None


class TestJobEnvironment:
    def test_outside_a_job_there_is_none(self) -> None:
        assert job_from_env({"PATH": "/bin"}) is None

    def test_inside_a_job_the_environment_names_it(self) -> None:
        job = job_from_env(
            {
                "SLURM_JOB_ID": "42",
                "SLURM_JOB_NODELIST": "n1,n2",
                "SLURM_JOB_START_TIME": "1000",
                "SLURM_JOB_END_TIME": "4600",
            }
        )
        assert job is not None
        assert job.job_id == "42"
        assert job.nodes == ("n1", "n2")
        assert (job.started_at, job.ends_at) == (1000.0, 4600.0)

    def test_slurm_22_05_sets_no_end_time(self) -> None:
        job = job_from_env({"SLURM_JOB_ID": "42"})
        assert job is not None
        assert job.ends_at is None


# What squeue 22.05 printed on the private cluster (stdout, stderr, exit status), with
# the controller up, with it killed, and with it stopped (SIGSTOP: it answers nothing).
SQUEUE_UP = ("2|RUNNING|None|2026-12-05T22:09:28|2026-12-05T22:09:29|Unknown|n1|1\n", "", 0)
SQUEUE_FORGOTTEN = ("", "slurm_load_jobs error: Invalid job id specified\n", 1)
SQUEUE_DOWN = (
    "",
    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
    1,
)
SQUEUE_HUNG = ("", "slurm_load_jobs error: Socket timed out on send/recv operation\n", 1)


class TestSqueueAnswers:
    def test_an_exit_0_answer_lists_the_jobs_it_knows(self) -> None:
        assert read_squeue_answer(SQUEUE_UP[2], *SQUEUE_UP[:2])["2"].running

    def test_invalid_job_id_is_the_controller_saying_it_knows_none_of_them(self) -> None:
        assert read_squeue_answer(SQUEUE_FORGOTTEN[2], *SQUEUE_FORGOTTEN[:2]) == {}

    @pytest.mark.parametrize("answer", [SQUEUE_DOWN, SQUEUE_HUNG], ids=["killed", "stopped"])
    def test_a_controller_that_does_not_answer_says_nothing_about_the_jobs(
        self, answer: tuple[str, str, int]
    ) -> None:
        with pytest.raises(SlurmQueryFailed, match="squeue exited 1: slurm_load_jobs error"):
            read_squeue_answer(answer[2], *answer[:2])


def fake_squeue(folder: Path) -> Path:
    """Write a ``squeue`` that replays one of the answers above, chosen by a file."""
    program = folder / "squeue"
    answer = folder / "answer"
    program.write_text(
        f'#!/bin/sh\n. "{answer}"\nprintf "%s" "$OUT"; printf "%s" "$ERR" >&2; exit "$CODE"\n',
        encoding="ascii",
    )
    program.chmod(0o755)
    return answer


def answer_with(path: Path, answer: tuple[str, str, int]) -> None:
    out, err, code = answer
    path.write_text(f"OUT='{out}'\nERR='{err}'\nCODE={code}\n", encoding="ascii")


@pytest.mark.asyncio
class TestAWatchThroughAnOutage:
    """``AllocationWatch`` against a real ``squeue`` process replaying the answers above."""

    async def watch(self, tmp_path: Path, unreachable: float) -> tuple[AllocationWatch, Path]:
        answer = fake_squeue(tmp_path)
        answer_with(answer, SQUEUE_UP)

        async def submit() -> list[str]:
            return ["2"]

        env = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
        watch = AllocationWatch(submit, env=env, poll_seconds=60, unreachable_seconds=unreachable)
        await watch.request()
        return watch, answer

    async def test_no_answer_ends_no_job_and_the_outage_is_told(self, tmp_path: Path) -> None:
        watch, answer = await self.watch(tmp_path, unreachable=300.0)
        told: list[tuple[str, dict[str, object]]] = []
        watch.on_outage = lambda kind, details: told.append((kind, details))
        assert watch.current[0].state == "RUNNING"
        for down in (SQUEUE_DOWN, SQUEUE_HUNG):
            answer_with(answer, down)
            await watch.refresh()
            assert watch.current[0].state == "RUNNING"
            assert not watch.current[0].ended
            assert not watch.is_lost
        assert [kind for kind, _ in told] == ["slurm_unreachable"]
        assert told[0][1]["jobs"] == ["2"]
        assert watch.unreachable_since is not None
        answer_with(answer, SQUEUE_UP)
        await watch.refresh()
        assert [kind for kind, _ in told] == ["slurm_unreachable", "slurm_reachable"]
        assert watch.unreachable_since is None
        assert not watch.is_lost

    async def test_past_unreachable_seconds_the_jobs_are_given_up_unknown(
        self, tmp_path: Path
    ) -> None:
        watch, answer = await self.watch(tmp_path, unreachable=0.0)
        told: list[str] = []
        watch.on_outage = lambda kind, _details: told.append(kind)
        answer_with(answer, SQUEUE_DOWN)
        await watch.refresh()
        assert told == ["slurm_unreachable", "slurm_unreachable_gave_up"]
        assert (watch.current[0].state, watch.current[0].end_reason) == ("UNKNOWN", "unknown")
        assert watch.is_lost

    async def test_a_job_the_controller_forgot_has_ended(self, tmp_path: Path) -> None:
        watch, answer = await self.watch(tmp_path, unreachable=300.0)
        answer_with(answer, SQUEUE_FORGOTTEN)
        await watch.refresh()
        assert watch.current[0].end_reason == "unknown"
        assert watch.is_lost
