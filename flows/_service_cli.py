"""What the campaign commands do; imported by their handlers only (it imports Prefect)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

import psutil

from flows._connect import connect, ui_url
from flows._paths import state_dir_from
from flows._server import flow_run_ui_url
from policies import NotFound, ValidationFailed

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

    from flows._service import Submitted

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _state_dir() -> Path:
    return state_dir_from(None, os.environ)


def _runner_pid_file() -> Path:
    return _state_dir() / "runner.pid"


def _run_link(flow_run_id: object) -> str:
    return flow_run_ui_url(ui_url(), flow_run_id)


def _parse_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise ValidationFailed(f"'{text}' is not a flow run id", details={"field": "run"}) from None


def submit_now(spec: str, site: str | None, *, start: bool) -> Submitted:
    """Validate the spec (before touching any server), connect, submit."""
    from flows._service import validate_submission

    validate_submission(spec, site, os.environ)  # bad input fails here, nothing registered
    connect(start=start)
    from flows._service import submit_campaign

    return asyncio.run(submit_campaign(spec, site=site))


def print_submitted(submitted: Submitted) -> None:
    """Print the run id and its UI link."""
    verb = "already running" if submitted.already_active else "submitted"
    print(f"campaign {submitted.campaign} {verb}: flow run {submitted.flow_run_id}")
    print(f"  UI: {_run_link(submitted.flow_run_id)}")
    if not runner_alive():
        print(
            "  note: no runner is serving on this node; start one with 'unattended serve --detach'"
        )


def runner_alive() -> bool:
    """Return whether the background runner of this state directory runs."""
    path = _runner_pid_file()
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return False
    return bool(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)


def start_detached_runner(query_seconds: float = 1.0) -> int:
    """Start ``unattended serve`` in its own session, logging under the state directory."""
    connect(start=False)
    if runner_alive():
        return int(_runner_pid_file().read_text().strip())
    log = _state_dir() / "runner.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "flows._cli", "serve", "--query-seconds", str(query_seconds)],
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
            start_new_session=True,
        )
    _runner_pid_file().write_text(str(process.pid))
    return process.pid


def ensure_runner() -> None:
    """Start the background runner unless one already serves this state directory."""
    if not runner_alive():
        pid = start_detached_runner()
        print(
            f"started the runner in the background (pid {pid}); log: {_state_dir() / 'runner.log'}"
        )


def stop_runner() -> bool:
    """Stop the background runner (before the server: the other order hangs)."""
    path = _runner_pid_file()
    if not runner_alive():
        path.unlink(missing_ok=True)
        return False
    pid = int(path.read_text().strip())
    os.killpg(pid, signal.SIGTERM)
    try:
        psutil.Process(pid).wait(timeout=20)
    except psutil.TimeoutExpired:
        os.killpg(pid, signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass
    path.unlink(missing_ok=True)
    return True


# Flow-run processes inherit the runner's environment. The surrogate's matrices are
# small; threaded BLAS on a shared login node only contends (2-4x slower measured).
_SINGLE_THREADED_BLAS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def serve_foreground(query_seconds: float) -> int:
    """Serve campaign runs until SIGTERM or Ctrl-C."""
    connect(start=False)
    for variable in _SINGLE_THREADED_BLAS:
        os.environ.setdefault(variable, "1")
    from flows._service import CampaignService

    path = _runner_pid_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
    print(f"serving campaign runs from {os.environ.get('PREFECT_API_URL')}", flush=True)
    try:
        asyncio.run(CampaignService(query_seconds=query_seconds).serve())
    except KeyboardInterrupt:
        pass
    finally:
        if path.exists() and path.read_text().strip() == str(os.getpid()):
            path.unlink()
    return 0


def follow(flow_run_id: UUID, *, wait_for_approval: bool) -> int:
    """Show a run's progress until it ends; return the campaign's exit code.

    Progress (rounds, gate calls, attempts, batches, tasks done and failed) is
    read once a second from the campaign's provenance database, opened read-only,
    beside the flow run's state: with ``rich`` on a terminal, as plain lines
    otherwise. Ctrl-C stops following; the campaign goes on.
    """
    from flows._cli_campaign import EXIT_CODES
    from flows._progress import CampaignProgress
    from flows._service import read_run

    progress = CampaignProgress(live=sys.stdout.isatty())
    last = None
    try:
        with progress:
            while True:
                flow_run = asyncio.run(read_run(flow_run_id))
                state = flow_run.state
                name = state.type.value if state else "UNKNOWN"
                progress.poll(flow_run)
                if name != last:
                    progress.say(
                        f"[{time.strftime('%H:%M:%S')}] flow run {flow_run.name}: "
                        f"{state.name if state else name}"
                    )
                    if name == "PAUSED":
                        with progress.paused():
                            _print_how_to_approve(flow_run)
                    last = name
                if name == "PAUSED" and not wait_for_approval:
                    return EXIT_CODES["awaiting_approval"]
                if name in TERMINAL:
                    break
                time.sleep(1.0)
        return _final(flow_run)
    except KeyboardInterrupt:
        print(
            f"\nstopped following; the campaign goes on. Follow it again with "
            f"'unattended status {flow_run_id}' or 'unattended run' on the same spec.",
            file=sys.stderr,
        )
        return 130


def _final(flow_run: FlowRun) -> int:
    from flows._cli_campaign import EXIT_CODES

    state = flow_run.state
    message = (state.message or "") if state else ""
    print(f"finished: {state.name if state else '?'} {message}".rstrip())
    if state is not None and state.type.value == "COMPLETED":
        return 0
    for status, code in EXIT_CODES.items():
        if message.startswith(f"campaign {status}"):
            return code
    return EXIT_CODES["failed"]


def _print_how_to_approve(flow_run: FlowRun) -> None:
    from flows._service import pending_approval

    try:
        pending = pending_approval(flow_run)
    except Exception:  # noqa: BLE001  # the hint is best effort; the run state is what matters
        pending = None
    print("  the campaign waits for approval")
    if pending is not None:
        print(f"  rule: {pending.rule}; approvers: {', '.join(pending.approvers) or '-'}")
        if pending.deadline:
            print(f"  answer by {pending.deadline.isoformat(timespec='seconds')}")
    print(f"  in the Prefect UI: {_run_link(flow_run.id)}  (menu > Resume)")
    print(
        f"  or: unattended approve {flow_run.id} --as NAME [--reject] [--comment TEXT]", flush=True
    )


def show_runs() -> int:
    """List recent campaign runs."""
    connect(start=False)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter
    from prefect.client.schemas.sorting import FlowRunSort

    from flows._service import TAG

    async def runs() -> list[FlowRun]:
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(tags={"all_": [TAG]}),  # type: ignore[arg-type]
                sort=FlowRunSort.START_TIME_DESC,
                limit=50,
            )

    found = asyncio.run(runs())
    if not found:
        print("no campaign runs")
    for flow_run in found:
        campaign = next(
            (t.split(":", 1)[1] for t in flow_run.tags if t.startswith("campaign:")), "?"
        )
        state = flow_run.state.name if flow_run.state else "?"
        print(f"{flow_run.id}  {campaign:<24} {state:<12} {_run_link(flow_run.id)}")
    return 0


def show_run(run: str) -> int:
    """Show one run's state and, when it waits, how to approve it."""
    connect(start=False)
    from flows._service import read_run

    flow_run = asyncio.run(read_run(_parse_id(run)))
    state = flow_run.state
    print(f"flow run {flow_run.id} ({flow_run.name}): {state.name if state else '?'}")
    if state and state.message:
        print(f"  {state.message}")
    print(f"  UI: {_run_link(flow_run.id)}")
    if state and state.is_paused():
        _print_how_to_approve(flow_run)
    return 0


def show_approvals() -> int:
    """List every run that waits for an approval, with how to answer."""
    connect(start=False)
    from flows._service import suspended_runs

    runs = asyncio.run(suspended_runs())
    if not runs:
        print("no approvals pending")
    for flow_run in runs:
        print(f"flow run {flow_run.id} ({flow_run.name})")
        _print_how_to_approve(flow_run)
    return 0


def answer(run: str, approver: str, *, reject: bool, comment: str, batch_size: int | None) -> int:
    """Answer a run's approval request through the resume API."""
    connect(start=False)
    from flows._service import approve_run, read_run

    flow_run_id = _parse_id(run)
    flow_run = asyncio.run(read_run(flow_run_id))
    if flow_run.state is None or not flow_run.state.is_paused():
        raise NotFound(f"flow run {flow_run_id} is not waiting for approval", details={"run": run})
    asyncio.run(
        approve_run(
            flow_run_id, approver=approver, reject=reject, comment=comment, batch_size=batch_size
        )
    )
    print(f"{'rejected' if reject else 'approved'} as {approver}; the run resumes shortly")
    print("  (an approver not allowed by the rule is recorded and the run waits again)")
    return 0
