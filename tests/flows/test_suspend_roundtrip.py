"""Suspend a deployed flow for approval and resume it with a form input, on a real server.

The flow below is what the campaign flow does at an approval: it suspends with
a ``RunInput`` form (the UI renders it from the stored JSON schema), the
process exits, and after the resume the flow runs again *from the top* in a
new process, where ``suspend_flow_run`` returns the submitted input.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import httpx
import psutil
import pytest
from prefect import flow
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.flow_runs import resume_flow_run, suspend_flow_run
from prefect.input import RunInput
from prefect.runner import Runner
from pydantic import Field

from flows._prefect._runner import deploy_flow, drive_once, make_runner
from flows._prefect._server import ServerHandle

pytestmark = [
    pytest.mark.integration,
    # The session's server start (12 s idle, over 60 s on a loaded 2-core box) is
    # bounded by start_server's own timeout; the 120 s budget is for the test.
    pytest.mark.timeout(120, func_only=True),
]

APPROVAL_DESCRIPTION = "## Approve round 1?\n\nThe batch needs **64 node-hours**."
_ENTRYPOINT = f"{Path(__file__).resolve()}:approval_toy"


class Approval(RunInput):
    """The approval form: an explicit choice, so doing nothing in the UI still means approve."""

    decision: Literal["approve", "reject"] = "approve"
    approver: str = Field(min_length=1)
    comment: str = ""


def _record(progress: str, event: str, **data: Any) -> None:
    with Path(progress).open("a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "pid": os.getpid(), **data}) + "\n")


@flow(name="approval-toy")
async def approval_toy(progress: str) -> str:
    """Record a start, suspend for an ``Approval``, then record what the form said."""
    _record(progress, "started")
    form = Approval.with_initial_data(description=APPROVAL_DESCRIPTION)
    # In an async flow the call dispatches to asuspend_flow_run, but is typed as the sync one.
    approval = await suspend_flow_run(  # type: ignore[misc]
        wait_for_input=form, key="round-1", timeout=600
    )
    _record(progress, "resumed", approval=approval.model_dump())
    return str(approval.decision)


def _start_run(deployment: uuid.UUID | str, progress: Path) -> FlowRun:
    """Create a run of ``deployment`` and return at once (``timeout=0``), as submit does."""
    run = run_deployment(deployment, parameters={"progress": str(progress)}, timeout=0)
    assert isinstance(run, FlowRun)  # the sync dispatch, typed as a union with a coroutine
    return run


def _events(progress: Path) -> list[dict[str, Any]]:
    if not progress.exists():
        return []
    return [json.loads(line) for line in progress.read_text(encoding="utf-8").splitlines()]


def _flow_run(flow_run_id: uuid.UUID) -> FlowRun:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def _run_input(flow_run_id: uuid.UUID, key: str) -> str:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run_input(flow_run_id, key)


def _wait_for_state(flow_run_id: uuid.UUID, state: StateType, timeout: float = 60) -> FlowRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = _flow_run(flow_run_id)
        if run.state is not None and run.state.type == state:
            return run
        time.sleep(0.1)
    raise AssertionError(f"flow run {flow_run_id} not {state.value} within {timeout} s")


class SuspendedRun:
    """A run of ``approval_toy`` that the runner drove until it suspended."""

    def __init__(self, runner: Runner, flow_run_id: uuid.UUID, progress: Path) -> None:
        self.runner = runner
        self.id = flow_run_id
        self.progress = progress


def _start_suspended_run(tmp_path: Path) -> SuspendedRun:
    runner = make_runner()
    # A deployment per test: a runner only picks up its own deployments' runs.
    deployment_id = deploy_flow(
        runner, approval_toy, name=f"toy-{uuid.uuid4().hex[:8]}", by_module=False
    )
    progress = tmp_path / "progress.jsonl"
    run = _start_run(deployment_id, progress)
    drive_once(runner)
    return SuspendedRun(runner, run.id, progress)


@pytest.fixture
def suspended_run(prefect_server: ServerHandle, tmp_path: Path) -> SuspendedRun:
    """Deploy the toy flow, start a run and drive it until it is Suspended."""
    return _start_suspended_run(tmp_path)


@pytest.fixture(scope="module")
def shared_suspended_run(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> SuspendedRun:
    """One Suspended run for tests that only read it (or are refused), to save run starts."""
    return _start_suspended_run(tmp_path_factory.mktemp("suspended"))


class TestSuspend:
    def test_run_is_suspended_with_a_keyed_input_form(
        self, shared_suspended_run: SuspendedRun
    ) -> None:
        state = _flow_run(shared_suspended_run.id).state
        assert state is not None
        assert (state.type, state.name) == (StateType.PAUSED, "Suspended")
        assert state.state_details.pause_key == "round-1"
        assert state.state_details.run_input_keyset == {
            "description": "suspended-round-1-description",
            "response": "suspended-round-1-response",
            "schema": "suspended-round-1-schema",
        }

    def test_form_schema_is_stored_for_the_ui(self, shared_suspended_run: SuspendedRun) -> None:
        schema = json.loads(_run_input(shared_suspended_run.id, "suspended-round-1-schema"))
        assert schema["required"] == ["approver"]
        assert schema["properties"]["decision"]["enum"] == ["approve", "reject"]
        assert schema["properties"]["decision"]["default"] == "approve"

    def test_description_markdown_is_stored_json_encoded(
        self, shared_suspended_run: SuspendedRun
    ) -> None:
        stored = _run_input(shared_suspended_run.id, "suspended-round-1-description")
        assert json.loads(stored) == APPROVAL_DESCRIPTION


class TestResume:
    def test_flow_reruns_from_the_top_and_sees_the_input(self, suspended_run: SuspendedRun) -> None:
        form = {"decision": "reject", "approver": "ana", "comment": "too big"}
        resume_flow_run(suspended_run.id, run_input=form)
        drive_once(suspended_run.runner)

        assert _flow_run(suspended_run.id).state_type == StateType.COMPLETED
        events = _events(suspended_run.progress)
        assert [e["event"] for e in events] == ["started", "started", "resumed"]
        assert events[0]["pid"] != events[1]["pid"]  # a new process after the resume
        assert events[2]["approval"] == form

    def test_invalid_input_is_refused_and_run_stays_suspended(
        self, suspended_run: SuspendedRun
    ) -> None:
        with pytest.raises(RuntimeError, match="'maybe' is not one of"):
            resume_flow_run(suspended_run.id, run_input={"decision": "maybe", "approver": "x"})
        drive_once(suspended_run.runner)

        assert _flow_run(suspended_run.id).state_type == StateType.PAUSED
        assert [e["event"] for e in _events(suspended_run.progress)] == ["started"]


class TestResumeEndpoint:
    """POST /flow_runs/{id}/resume with a ``run_input`` body, as the UI's Resume dialog does."""

    def test_valid_input_is_accepted_with_201(
        self, prefect_server: ServerHandle, suspended_run: SuspendedRun
    ) -> None:
        response = httpx.post(
            f"{prefect_server.api_url}/flow_runs/{suspended_run.id}/resume",
            auth=prefect_server.basic_auth,
            verify=prefect_server.verify(),
            json={"run_input": {"approver": "ana", "decision": "approve"}},
        )
        body = response.json()
        drive_once(suspended_run.runner)  # leave no Resuming run behind

        assert response.status_code == httpx.codes.CREATED
        assert body["status"] == "ACCEPT"
        assert body["details"] == {"type": "accept_details"}
        assert (body["state"]["type"], body["state"]["name"]) == ("SCHEDULED", "Resuming")

    def test_invalid_input_is_refused_with_200_reject(
        self, prefect_server: ServerHandle, shared_suspended_run: SuspendedRun
    ) -> None:
        response = httpx.post(
            f"{prefect_server.api_url}/flow_runs/{shared_suspended_run.id}/resume",
            auth=prefect_server.basic_auth,
            verify=prefect_server.verify(),
            json={"run_input": {"comment": "no name given"}},
        )
        body = response.json()

        assert response.status_code == httpx.codes.OK
        assert body["status"] == "REJECT"
        assert body["details"]["type"] == "abort_details"
        assert "'approver' is a required property" in body["details"]["reason"]
        assert body["state"]["type"] == "PAUSED"

    def test_resuming_a_finished_run_is_aborted(
        self, prefect_server: ServerHandle, suspended_run: SuspendedRun
    ) -> None:
        resume_flow_run(suspended_run.id, run_input={"approver": "ana"})
        drive_once(suspended_run.runner)
        response = httpx.post(
            f"{prefect_server.api_url}/flow_runs/{suspended_run.id}/resume",
            auth=prefect_server.basic_auth,
            verify=prefect_server.verify(),
            json={"run_input": {"approver": "ana"}},
        )

        assert response.status_code == httpx.codes.OK
        assert response.json()["status"] == "ABORT"


_RUNNER_SCRIPT = """
import sys
from prefect.flows import load_flow_from_entrypoint
from flows._prefect._runner import serve

if __name__ == "__main__":  # the runner spawns flow runs with multiprocessing
    serve([load_flow_from_entrypoint(sys.argv[1])], deployment_name=sys.argv[2], by_module=False)
"""


class TestRunnerRestart:
    def test_resume_works_after_the_runner_is_killed_while_suspended(
        self, prefect_server: ServerHandle, tmp_path: Path
    ) -> None:
        name = f"toy-{uuid.uuid4().hex[:8]}"
        serving = subprocess.Popen(
            [sys.executable, "-c", _RUNNER_SCRIPT, _ENTRYPOINT, name],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "runner.log").open("wb"),
        )
        try:
            progress = tmp_path / "progress.jsonl"
            run = _wait_for_deployment_then_run(f"approval-toy/{name}", progress)
            _wait_for_state(run.id, StateType.PAUSED)
            # "Suspended" is set before the form schema is saved and the process
            # exits; kill the runner only once its flow-run process is gone.
            _wait_for_input(run.id, "suspended-round-1-schema")
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(_events(progress)[0]["pid"]).wait(timeout=30)
        finally:
            os.killpg(serving.pid, signal.SIGKILL)
            serving.wait(timeout=30)

        fresh = make_runner()
        deploy_flow(fresh, approval_toy, name=name, by_module=False)
        resume_flow_run(run.id, run_input={"approver": "ana"})
        drive_once(fresh)

        assert _flow_run(run.id).state_type == StateType.COMPLETED
        events = _events(progress)
        assert [e["event"] for e in events] == ["started", "started", "resumed"]
        # Fields the form left out take their defaults.
        assert events[2]["approval"] == {"decision": "approve", "approver": "ana", "comment": ""}


def _wait_for_deployment_then_run(deployment: str, progress: Path, timeout: float = 60) -> FlowRun:
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    while True:
        try:
            run = _start_run(deployment, progress)
        except ObjectNotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        else:
            return run


def _wait_for_input(flow_run_id: uuid.UUID, key: str, timeout: float = 30) -> None:
    from prefect.exceptions import PrefectHTTPStatusError

    deadline = time.monotonic() + timeout
    while True:
        try:
            _run_input(flow_run_id, key)
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code != httpx.codes.NOT_FOUND or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        else:
            return
