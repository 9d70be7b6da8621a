"""The runner starts flow runs from a warm forkserver, and wakes up when nudged.

Real Prefect server, real runner (``CampaignService``), the real demo campaign.
How much faster this is lives in ``benchmarks/latency.py``, not here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from uuid import UUID

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


def one_round_demo(tmp_path: Path, name: str) -> Path:
    """Copy the demo campaign, renamed and cut to one round; return its spec."""
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    spec = tmp_path / "campaign.toml"
    text = spec.read_text().replace('name = "demo"', f'name = "{name}"')
    spec.write_text(text.replace("rounds = 4", "rounds = 1"))
    return spec


def flow_run_logs(flow_run_id: UUID) -> list[str]:
    """Return the run's log messages as the API stores them."""
    from flows._prefect._rest import api

    body = {"logs": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 200}
    with api(os.environ) as client:
        return [row["message"] for row in client.checked("POST", "logs/filter", body)]


async def final_state(flow_run_id: UUID) -> str:
    """Wait for the run to end (the test's timeout bounds it); return its state."""
    ended = ("COMPLETED", "FAILED", "CRASHED")
    while (state := await state_of(flow_run_id)) not in ended:  # noqa: ASYNC110  # the API
        await asyncio.sleep(0.2)
    return state


async def state_of(flow_run_id: UUID) -> str:
    from flows._prefect._service import read_run

    run = await read_run(flow_run_id)
    return run.state.type.value if run.state else "NONE"


class TestWarmStart:
    @pytest.mark.asyncio
    async def test_a_run_forked_from_the_warm_parent_completes_with_its_logs_at_the_api(
        self, prefect_server, tmp_path
    ):
        from prefect.runner import _starter_direct

        from flows._prefect._deployment import submit_campaign
        from flows._prefect._service import CampaignService
        from flows._prefect._warm_start import run_flow_in_forkserver

        spec = one_round_demo(tmp_path, "warm-logs")
        submitted = await submit_campaign(spec, state_dir=tmp_path / "home")
        await CampaignService(query_seconds=0.5, state_dir=tmp_path / "home").run_once()
        assert _starter_direct.run_flow_in_subprocess is run_flow_in_forkserver
        assert await state_of(submitted.flow_run_id) == "COMPLETED"
        messages = flow_run_logs(submitted.flow_run_id)
        assert any(m.startswith("Finished in state Completed") for m in messages)


class TestNudge:
    @pytest.mark.asyncio
    async def test_a_nudge_starts_a_new_campaign_the_runner_would_not_poll_for(
        self, prefect_server, tmp_path
    ):
        """With hour-long polls and watches, only the nudge can start the run."""
        from flows._prefect._deployment import submit_campaign
        from flows._prefect._nudge import NUDGE_SIGNAL
        from flows._prefect._service import CampaignService

        service = CampaignService(
            query_seconds=3600, watch_seconds=3600, state_dir=tmp_path / "home"
        )
        serving = asyncio.create_task(service.serve())
        try:
            while not service.runner.started:  # noqa: ASYNC110  # Prefect's flag, no event
                await asyncio.sleep(0.05)
            spec = one_round_demo(tmp_path, "nudged")
            submitted = await submit_campaign(spec, state_dir=tmp_path / "home")
            os.kill(os.getpid(), NUDGE_SIGNAL)
            assert await final_state(submitted.flow_run_id) == "COMPLETED"
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)

    @pytest.mark.asyncio
    async def test_a_submission_is_taken_while_a_sweep_is_still_going(
        self, prefect_server, tmp_path, monkeypatch
    ):
        """A sweep that never ends (fifty campaigns' worth, at the limit) holds no submission.

        Submissions had their turn after the watchdog's sweep in one loop: with fifty
        campaigns registered the CLI's request waited the sweep out, past the five
        seconds it gives the runner, and then submitted by itself.
        """
        from flows._prefect import _submissions
        from flows._prefect._nudge import NUDGE_SIGNAL
        from flows._prefect._service import CampaignService

        # The runner is this test's process, not an `unattended serve` command line.
        monkeypatch.setattr(
            _submissions, "nudge_runner", lambda pid: os.kill(pid, NUDGE_SIGNAL) is None
        )
        home = tmp_path / "home"
        service = CampaignService(query_seconds=3600, watch_seconds=3600, state_dir=home)
        sweeping = asyncio.Event()

        async def endless_sweep(**_: object) -> list[str]:
            sweeping.set()
            await asyncio.Event().wait()
            return []

        service.watchdog.sweep = endless_sweep  # type: ignore[method-assign]
        serving = asyncio.create_task(service.serve())
        try:
            await asyncio.wait_for(sweeping.wait(), 60)
            while not service.runner.started:  # noqa: ASYNC110  # Prefect's flag, no event
                await asyncio.sleep(0.05)
            spec = one_round_demo(tmp_path, "mid-sweep")
            submitted = await asyncio.to_thread(
                _submissions.submit_via_runner, spec, None, home, os.getpid()
            )
            assert submitted is not None, "the runner did not take the submission"
            assert await final_state(submitted.flow_run_id) == "COMPLETED"
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)


@pytest.fixture(scope="class")
def serving(prefect_server, tmp_path_factory):
    """``unattended serve`` up in its own state directory; yields (env, folder, log)."""
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path_factory.mktemp("via-runner")
    env = {**os.environ, "UNATTENDED_HOME": str(folder / "home"), "PYTHONWARNINGS": ""}
    log = folder / "runner.log"
    with log.open("wb") as out:
        runner = subprocess.Popen(
            [sys.executable, "-m", "flows._cli", "serve"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        while "serving campaign runs" not in log.read_text():
            assert runner.poll() is None, log.read_text()
            time.sleep(0.1)
        yield env, folder, log
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(timeout=60)


def submit_cold(env: dict[str, str], spec: Path):
    """Run ``unattended submit SPEC`` in a fresh interpreter under ``-X importtime``."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flows._cli", "submit", str(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


class TestSubmitThroughTheRunner:
    def test_submit_hands_the_campaign_to_the_running_runner_without_importing_prefect(
        self, serving
    ):
        """``unattended submit`` with ``unattended serve`` up: the runner submits and runs it.

        The command imports neither Prefect nor the planners and the engine (numpy): the
        runner, which has them imported, validates the campaign.
        """
        import re
        import time

        from flows._prefect import _rest as rest

        env, folder, log = serving
        spec = one_round_demo(folder, "via-runner")
        done = submit_cold(env, spec)
        assert done.returncode == 0, done.stderr[-2000:] + log.read_text()[-2000:]
        assert not re.search(r"\| +prefect(\.|$)", done.stderr, re.MULTILINE)
        assert not re.search(r"\| +numpy(\.|$)", done.stderr, re.MULTILINE)
        found = re.search(r"flow run ([0-9a-f-]{36})", done.stdout)
        assert found is not None
        flow_run_id = UUID(found.group(1))
        while rest.read_run(env, flow_run_id).state_type not in ("COMPLETED", "FAILED"):
            time.sleep(0.2)
        assert rest.read_run(env, flow_run_id).state_type == "COMPLETED"
        assert list((folder / "home" / "submissions").iterdir()) == []

    def test_a_request_whose_nudge_was_lost_is_taken_at_the_next_pass(self, serving):
        """A nudge sent while the runner starts is ignored; the request must not wait for ever.

        ``unattended submit`` right after ``serve --detach`` nudges a runner still
        importing Prefect: without a pass that looks anyway, the command gave up after
        ``TAKE_SECONDS`` and submitted by itself, importing Prefect after all.
        """
        import json
        import time

        from flows._cli._runner import LISTENING_LINE
        from flows._paths import private_dir
        from flows._prefect import _rest as rest
        from flows._prefect._submissions import _write_atomically, spool_dir

        env, folder, log = serving
        deadline = time.monotonic() + 60
        # Connected to the event stream: its first pass, which looks anyway, is over.
        while LISTENING_LINE not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        (folder / "lost").mkdir()
        spec = one_round_demo(folder / "lost", "via-runner-lost")
        spool = private_dir(spool_dir(folder / "home"))
        request, answer = spool / "lost.request.json", spool / "lost.answer.json"
        body = {"spec": str(spec), "site": None, "state_dir": str(folder / "home")}
        _write_atomically(request, {**body, "accept_changes": False})  # and no nudge
        deadline = time.monotonic() + 60
        while not answer.exists():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        data = json.loads(answer.read_text())
        answer.unlink()
        assert data.get("campaign") == "via-runner-lost", data
        flow_run_id = UUID(data["flow_run_id"])
        while rest.read_run(env, flow_run_id).state_type not in ("COMPLETED", "FAILED"):
            time.sleep(0.2)
        assert rest.read_run(env, flow_run_id).state_type == "COMPLETED"

    def test_bad_input_handed_to_the_runner_is_refused_with_its_field_and_nothing_registered(
        self, serving
    ):
        from flows._prefect import _rest as rest

        env, folder, log = serving
        (folder / "bad").mkdir()
        spec = one_round_demo(folder / "bad", "via-runner-bad")
        spec.write_text(spec.read_text().replace("rounds = 1", "rounds = -3"))
        done = submit_cold(env, spec)
        assert done.returncode == 2, done.stdout + done.stderr[-2000:] + log.read_text()[-2000:]
        assert "rounds" in done.stderr.splitlines()[-1]
        with rest.api(env) as client:
            body = {"deployments": {"name": {"any_": ["via-runner-bad"]}}}
            assert client.checked("POST", "deployments/filter", body) == []
        assert list((folder / "home" / "submissions").iterdir()) == []


class TestRunnerCommand:
    """A nudge goes to a runner however it was started, and never to another process."""

    @pytest.mark.parametrize(
        "argv",
        [
            ["/venv/bin/python", "-m", "flows._cli", "serve"],
            ["/venv/bin/python", "/venv/bin/unattended", "serve"],
            ["/venv/bin/unattended", "serve", "--detach"],
        ],
    )
    def test_a_runner_is_recognised(self, argv):
        from flows._prefect._nudge import is_runner_command

        assert is_runner_command(argv)

    @pytest.mark.parametrize(
        "argv",
        [
            ["/venv/bin/unattended", "status"],
            ["/venv/bin/python", "-m", "http.server", "serve"],
            ["/usr/bin/vim", "unattended"],
        ],
    )
    def test_another_process_is_not(self, argv):
        from flows._prefect._nudge import is_runner_command

        assert not is_runner_command(argv)
