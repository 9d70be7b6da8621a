"""``submit``, ``run`` and ``extend`` hand a campaign to the server, then follow its run.

Submitting imports Prefect (unless this state directory's runner submits it:
``flows._prefect._submissions``); following reads the run's state from Prefect and
its progress from the campaign's provenance, once a second.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from flows._cli._exit import STATUS_EXIT
from flows._cli._runner import (
    RunnerError,
    nudge,
    runner_alive,
    runner_log,
    runner_log_tail,
    runner_pid,
    state_dir,
)
from flows._cli._runs import print_how_to_approve, recorded_ending, registered, run_link
from flows._prefect._connect import connect

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

    from flows._prefect._submissions import Submitted

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def submit_now(
    spec: str, site: str | None, *, start: bool, accept_changes: bool = False
) -> Submitted:
    """Validate the spec, connect, submit.

    When this state directory's runner is up, it validates and submits (it has
    Prefect, the planners and the engine imported already:
    ``flows._prefect._submissions``), and its verdict on bad input comes back with
    its code before anything is registered. Otherwise this process validates
    before touching any server, then submits.
    """
    from flows._prefect._submissions import submit_via_runner, validate_submission

    pid = runner_pid()
    if pid is None:
        validate_submission(spec, site, os.environ)  # bad input fails here, nothing started
    connect(start=start, announce=_say_on_stderr)
    # The runner resolves paths from its own directory: hand it absolute ones.
    site_arg = str(Path(site).resolve()) if site and Path(site).is_file() else site
    if pid is not None:
        submitted = submit_via_runner(
            Path(spec), site_arg, state_dir(), pid, accept_changes=accept_changes
        )
        if submitted is not None:
            return submitted
    from flows._prefect._deployment import submit_campaign

    submitted = asyncio.run(submit_campaign(spec, site=site, accept_changes=accept_changes))
    nudge()
    return submitted


def show_stored_completion(spec: str, site: str | None) -> bool:
    """Print a completed campaign's stored record and return True; False if it has none.

    A campaign is its name: running a completed one again would only replay its
    record, so nothing is submitted. A spec that changes more than an extension
    (``flows._engine._extension``) is refused by the check, naming each field; an
    extension returns False, so it is submitted.
    """
    from flows._check import require_valid
    from flows._cli._progress import progress_lines, read_progress
    from flows._paths import campaign_dir
    from flows._provenance._sqlite import open_read_only

    checked = require_valid(spec, site, os.environ)
    if checked.extension:
        return False  # an extension: submitted as usual, the next run does the rounds added
    name = checked.loaded.spec.name
    url = checked.site.provenance_url
    location: str | Path
    if url is not None:
        location = url.get_secret_value()
    else:
        location = campaign_dir(state_dir(), name)
        if not (location / "provenance.db").exists():
            return False
    try:
        with open_read_only(location) as store:
            row = next((c for c in store.campaigns() if c["name"] == name), None)
            if row is None or row["status"] != "completed":
                return False
            rounds = read_progress(store, name)
    except Exception:  # noqa: BLE001  # no readable record: submit as usual, the flow reports it
        return False
    print(
        f"campaign {name} already completed; showing the stored record (nothing runs again; "
        "to run it afresh, give the spec a new name)"
    )
    for round_ in rounds:
        for line in progress_lines(round_):
            print(line)
    print("finished: Completed campaign completed (stored)")
    return True


def print_submitted(submitted: Submitted) -> None:
    """Print the run id and its UI link."""
    verb = "already running" if submitted.already_active else "submitted"
    print(f"campaign {submitted.campaign} {verb}: flow run {submitted.flow_run_id}")
    print(f"  UI: {run_link(submitted.flow_run_id)}")
    if not runner_alive():
        print(
            "  note: no runner is serving on this node; start one with 'unattended serve --detach'"
        )


def follow(flow_run_id: UUID, *, wait_for_approval: bool) -> int:
    """Show a run's progress until it ends; return the campaign's exit code.

    Progress (rounds, gate calls, attempts, batches, tasks done and failed) is
    read once a second from the campaign's provenance database, opened read-only,
    beside the flow run's state: with ``rich`` on a terminal, as plain lines
    otherwise. Ctrl-C stops following; the campaign goes on.
    """
    from flows._cli._progress import CampaignProgress
    from flows._prefect._service import read_run

    progress = CampaignProgress(live=sys.stdout.isatty())
    last = None
    # A runner that serves now and stops while the run goes on leaves nothing to run
    # it: that is said, not waited on. (None: no runner here; another serves it, say.)
    watched = runner_pid()
    try:
        with progress:
            while True:
                runner_gone = watched is not None and not runner_alive()
                flow_run = asyncio.run(read_run(flow_run_id))
                state = flow_run.state
                name = state.type.value if state else "UNKNOWN"
                if runner_gone and name not in TERMINAL:
                    break
                progress.poll(flow_run)
                if name != last:
                    progress.say(
                        f"[{time.strftime('%H:%M:%S')}] flow run {flow_run.name}: "
                        f"{state.name if state else name}"
                    )
                    if name == "PAUSED":
                        with progress.paused():
                            print_how_to_approve(
                                flow_run.id, registered(flow_run) or {}, _pause_key(flow_run)
                            )
                    last = name
                if name == "PAUSED" and not wait_for_approval:
                    return STATUS_EXIT["awaiting_approval"]
                if name in TERMINAL:
                    break
                time.sleep(1.0)
        if name not in TERMINAL:
            raise _runner_gone(flow_run, watched)
        return _final(flow_run)
    except KeyboardInterrupt:
        print(
            f"\nstopped following; the campaign goes on. Follow it again with "
            f"'unattended status {flow_run_id}' or 'unattended run' on the same spec.",
            file=sys.stderr,
        )
        return 130


def _runner_gone(flow_run: FlowRun, pid: int | None) -> RunnerError:
    """Return the error that says the runner stopped under a run that goes on (exit 1)."""
    state = flow_run.state.name if flow_run.state else "UNKNOWN"
    return RunnerError(
        f"the runner (pid {pid}) died (or was stopped) while flow run {flow_run.id} was "
        f"{state}; nothing "
        f"runs it until a runner serves this state directory again ('unattended serve "
        f"--detach'; 'unattended status {flow_run.id}' shows the run). The last line of "
        f"{runner_log()}: {runner_log_tail()}",
        details={"run": str(flow_run.id), "pid": pid, "log": str(runner_log())},
    )


def _final(flow_run: FlowRun) -> int:
    """Print how the run ended; return the exit code of its recorded ending.

    The ending the flow recorded in the provenance says it (``run_ending``); a run that
    recorded none (killed, or forced through the API) failed, as far as ``run`` knows.
    """
    state = flow_run.state
    message = (state.message or "") if state else ""
    print(f"finished: {state.name if state else '?'} {message}".rstrip())
    ending = recorded_ending(flow_run)
    if ending is None:
        return STATUS_EXIT["failed"]
    return next(
        (code for status, code in STATUS_EXIT.items() if status == ending.status),
        STATUS_EXIT["failed"],
    )


def _pause_key(flow_run: FlowRun) -> str:
    state = flow_run.state
    return (state.state_details.pause_key if state else None) or ""
