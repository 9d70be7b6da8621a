"""``unattended approve`` tells the truth: it waits for the flow's verdict and exits 6 on a refusal.

Real Prefect server (the session's, auth on), real runner driven in this process
while the CLI waits in a thread, real provenance. The runner is driven without the
approval watchdog, so an answer after the deadline reaches the flow's own judgement.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from uuid import UUID

import pyotp
import pytest

from flows._cli import main
from flows._cli._exit import EXIT_ANSWER_REFUSED
from flows._engine._proof import ApproverCodes
from flows._paths import approvers_dir
from flows._prefect._server import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


@dataclass
class Waiting:
    """A campaign suspended at its round-2 approval, and the runner that serves it."""

    name: str
    flow_run_id: UUID
    service: Any

    async def state(self) -> tuple[str, str | None]:
        from flows._prefect._service import read_run

        run = await read_run(self.flow_run_id)
        assert run.state is not None
        return run.state.type.value, run.state.state_details.pause_key

    async def drive(self) -> None:
        """Run what is due once, without the watchdog that answers expired requests."""
        await self.service.sync_deployments()
        await self.service.runner.start(run_once=True)

    def answer(self, *argv: str, run: str | None = None) -> int:
        """Run ``unattended approve`` in a thread while this thread drives the runner.

        The command runs as the campaign's owner (its state directory) and sees a runner
        serving it: this thread holds the runner's lock, as ``unattended serve`` does.
        """
        home = self.service.state_dir
        os.environ["UNATTENDED_HOME"] = str(home)
        lock = os.open(home / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return self._answer(run or str(self.flow_run_id), *argv)
        finally:
            os.close(lock)

    def _answer(self, run: str, *argv: str) -> int:
        with ThreadPoolExecutor(1) as pool:
            cli = pool.submit(main, ["approve", run, *argv, "--wait", "60"])
            while not cli.done():
                asyncio.run(self.drive())
            return int(cli.result())


def _suspend(
    tmp_path: Path,
    name: str,
    timeout_minutes: str,
    *,
    require_proof: bool = False,
    webhook_url: str | None = None,
) -> Waiting:
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService

    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    if require_proof:
        policy = tmp_path / "approval-policy.toml"
        rule = 'approvers = ["alice", "bob"]\n'
        policy.write_text(policy.read_text().replace(rule, rule + "require_proof = true\n"))
    spec = tmp_path / "campaign-approval.toml"
    text = spec.read_text().replace('name = "demo-approval"', f'name = "{name}"')
    text = text.replace("rounds = 4", "rounds = 3")
    text = text.replace("timeout_minutes = 60", f"timeout_minutes = {timeout_minutes}")
    if webhook_url is not None:
        text += f'\n[notify]\nwebhook_url = "{webhook_url}"\n'
    spec.write_text(text)
    submitted = asyncio.run(submit_campaign(spec, state_dir=tmp_path / "home"))
    waiting = Waiting(
        name, submitted.flow_run_id, CampaignService(query_seconds=0.5, state_dir=tmp_path / "home")
    )
    asyncio.run(waiting.drive())
    assert asyncio.run(waiting.state()) == ("PAUSED", f"{name}-r2-c1-n0")
    return waiting


@pytest.fixture(scope="module")
def waiting(prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory) -> Waiting:
    return _suspend(tmp_path_factory.mktemp("approve-cli"), "cli-verdict", "60")


class TestTheVerdict:
    def test_a_name_the_form_does_not_offer_is_refused_by_the_server_and_the_run_waits(
        self, waiting: Waiting, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The form's approver is a choice of the allowed names: 'mallory' is no answer."""
        code = waiting.answer("--as", "mallory")
        err = capsys.readouterr().err
        assert code == 2
        assert "refused the answer" in err
        assert "'mallory' is not one of ['alice', 'bob'" in err
        assert asyncio.run(waiting.state()) == ("PAUSED", "cli-verdict-r2-c1-n0")

    def test_an_allowed_approval_exits_0_and_says_what_runs(
        self, waiting: Waiting, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code = waiting.answer("--as", "alice", "--batch-size", "4")
        out = capsys.readouterr().out
        assert code == 0
        assert "approved by alice: the flow accepted the answer and runs its first 4" in out
        assert "resumes shortly" not in out
        assert asyncio.run(waiting.state())[0] == "COMPLETED"

    def test_an_answer_after_the_deadline_exits_6_and_names_the_timeout_policy(
        self,
        prefect_server: ServerHandle,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        webhook: Any,
    ) -> None:
        # The deadline passed at the suspend.
        late = _suspend(tmp_path, "cli-late", "0.0001", webhook_url=webhook.url)
        # The suspend was announced with the run's UI link and the command to answer it.
        (notice,) = [p["text"] for p in webhook.posts]
        assert notice.startswith("[unattended] campaign cli-late waits for approval (round 2)")
        assert f"{prefect_server.ui_url}/v2/runs/flow-run/{late.flow_run_id}" in notice
        assert f"CLI: unattended approve {late.flow_run_id} --as NAME" in notice
        code = late.answer("--as", "alice")
        err = capsys.readouterr().err
        assert code == EXIT_ANSWER_REFUSED == 6
        assert "refused: the answer arrived after the deadline" in err
        assert "it stopped (blocked, approval_timeout)" in err
        assert asyncio.run(late.state())[0] == "FAILED"


class TestACampaignName:
    def test_approve_takes_the_campaign_s_name_for_its_newest_run(
        self, prefect_server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        waiting = _suspend(tmp_path, "cli-by-name", "60")
        assert waiting.answer("--as", "bob", run="cli-by-name") == 0
        assert "approved by bob: the flow accepted the answer" in capsys.readouterr().out
        assert asyncio.run(waiting.state())[0] == "COMPLETED"

    def test_an_unknown_name_is_refused_naming_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        assert main(["approve", "nope", "--as", "alice"]) != 0
        assert "'nope' is neither a flow run id nor a campaign submitted from this state" in (
            capsys.readouterr().err
        )


class TestACodeProtectedRule:
    def test_a_wrong_code_exits_6_and_the_right_one_approves_recording_proofs_only(
        self, prefect_server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        codes = ApproverCodes(approvers_dir(tmp_path / "home"))
        totp = pyotp.TOTP(parse_qs(urlsplit(codes.enroll("alice")).query)["secret"][0])
        waiting = _suspend(tmp_path, "cli-proof", "60", require_proof=True)
        right = totp.now()
        wrong = f"{(int(right) + 1) % 1_000_000:06d}"

        assert waiting.answer("--as", "alice", "--code", wrong) == 6
        assert "refused: the one-time code was wrong" in capsys.readouterr().err
        assert asyncio.run(waiting.state()) == ("PAUSED", "cli-proof-r2-c1-n1")
        assert waiting.answer("--as", "alice", "--code", totp.now()) == 0
        assert asyncio.run(waiting.state())[0] == "COMPLETED"

        database = next((tmp_path / "home" / "campaigns" / "cli-proof").glob("*.db"))
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            proofs = connection.execute(
                "SELECT decided_by, decision, proof FROM approval_event ORDER BY id"
            ).fetchall()
            # Every column of the approval and its events: the codes are nowhere.
            kept = repr(connection.execute("SELECT * FROM approval_event").fetchall())
            kept += repr(connection.execute("SELECT * FROM approval").fetchall())
        assert proofs == [("alice", "not_allowed", "totp failed"), ("alice", "approved", "totp ok")]
        assert wrong not in kept


class TestTheRunnerEndsAnExpiredRequest:
    @pytest.mark.parametrize("require_proof", [False, True], ids=["plain", "proof"])
    def test_blocked_approval_timeout_and_recorded_as_the_runner_s(
        self, prefect_server: ServerHandle, tmp_path: Path, require_proof: bool
    ) -> None:
        """The form of a proof rule requires a code; the runner's answer has none."""
        from flows._prefect._service import expire_approvals

        name = f"cli-late-{'proof' if require_proof else 'plain'}"
        late = _suspend(tmp_path, name, "0.0001", require_proof=require_proof)
        os.environ["UNATTENDED_HOME"] = str(tmp_path / "home")
        assert asyncio.run(expire_approvals()) == [late.flow_run_id]
        asyncio.run(late.drive())

        assert asyncio.run(late.state())[0] == "FAILED"
        database = next((tmp_path / "home" / "campaigns" / name).glob("*.db"))
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            events = connection.execute(
                "SELECT decided_by, decision, proof FROM approval_event"
            ).fetchall()
            ending = connection.execute("SELECT status, error_code FROM campaign").fetchall()
        assert events == [("unattended:deadline", "timeout", None)]
        assert ending == [("blocked", "approval_timeout")]


@pytest.fixture(scope="module")
def waiting_subset(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Waiting, Path]:
    folder = tmp_path_factory.mktemp("approve-subset")
    return _suspend(folder, "cli-subset", "60"), folder


class TestApprovingASubset:
    def test_a_repeated_index_is_refused_naming_the_option(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as caught:
            main(
                [
                    "approve",
                    "00000000-0000-0000-0000-000000000000",
                    "--as",
                    "a",
                    "--candidates",
                    "0,0",
                ]
            )
        assert caught.value.code == 2
        assert "--candidates: each index once" in capsys.readouterr().err

    def test_an_index_outside_the_batch_is_refused_by_the_server_and_the_run_waits(
        self, waiting_subset: tuple[Waiting, Path], capsys: pytest.CaptureFixture[str]
    ) -> None:
        waiting, _ = waiting_subset
        code = waiting.answer("--as", "alice", "--candidates", "0,8")
        err = capsys.readouterr().err
        assert code != 0
        assert "refused the answer" in err
        assert "candidates" in err
        assert asyncio.run(waiting.state()) == ("PAUSED", "cli-subset-r2-c1-n0")

    def test_approving_indices_runs_exactly_those_and_strikes_the_rest(
        self, waiting_subset: tuple[Waiting, Path], capsys: pytest.CaptureFixture[str]
    ) -> None:
        waiting, folder = waiting_subset
        assert waiting.answer("--as", "alice", "--candidates", "5,0,2") == 0
        out = capsys.readouterr().out
        assert "runs candidates 5, 0, 2 (the others are struck)" in out
        assert asyncio.run(waiting.state())[0] == "COMPLETED"
        database = next((folder / "home" / "campaigns" / "cli-subset").glob("*.db"))
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            (proposed,) = connection.execute(
                "SELECT a.value FROM attempt a JOIN gate_call g ON a.gate_call_id = g.id "
                "WHERE g.round_index = 2 AND a.rejected_by IS NULL"
            ).fetchone()
            (launched,) = connection.execute(
                "SELECT candidates FROM batch WHERE round_index = 2"
            ).fetchone()
            fates = connection.execute(
                "SELECT candidate_index, fate, actor FROM candidate_fate "
                "WHERE round_index = 2 ORDER BY candidate_index"
            ).fetchall()
        candidates = json.loads(proposed)["candidates"]
        assert json.loads(launched) == [candidates[i] for i in (0, 2, 5)]
        assert fates == [
            (i, "launched", None) if i in (0, 2, 5) else (i, "struck", "alice") for i in range(8)
        ]


class TestAnAnswerTheRunCannotJudge:
    def test_inputs_changed_since_the_pin_end_the_run_and_approve_says_so(
        self, prefect_server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The policy edited in place: the resumed run refuses it; approve exits 2 saying why."""
        waiting = _suspend(tmp_path, "cli-changed", "60")
        policy = tmp_path / "approval-policy.toml"
        policy.write_text(policy.read_text() + "\n# edited while the run waited\n")
        code = waiting.answer("--as", "alice")
        err = capsys.readouterr().err
        assert code == 2
        assert "no verdict: the run ended Failed before judging the answer" in err
        assert "spec_changed" in err
        assert asyncio.run(waiting.state())[0] == "FAILED"

    def test_a_batch_size_with_candidates_is_refused_before_anything_is_sent(
        self, waiting: Waiting, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code = main(
            [
                "approve",
                str(waiting.flow_run_id),
                "--as",
                "alice",
                "--batch-size",
                "2",
                "--candidates",
                "0,1",
            ]
        )
        assert code == 2
        assert "give --batch-size or --candidates, not both" in capsys.readouterr().err
