"""What the campaign commands do; imported by their handlers only.

``submit``, ``run``, ``serve`` and ``follow`` import Prefect; ``status``, ``approvals`` and
``approve`` do not (they speak its REST API through ``flows._prefect._rest``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from flows._cli._exit import EXIT_ANSWER_REFUSED, EXIT_BAD_INPUT, EXIT_FAILED, STATUS_EXIT, fail
from flows._paths import (
    PRIVATE_UMASK,
    append_private,
    python_argv,
    runner_dir,
    state_dir_from,
    write_private,
)
from flows._prefect._connect import connect, ui_url
from flows._prefect._server import flow_run_ui_url
from policies import NotFound, UnattendedError, ValidationFailed

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

    from flows._prefect._pending import PendingApproval
    from flows._prefect._rest import RunView
    from flows._prefect._submissions import Submitted
    from flows._provenance import ApprovalEventRecord, RunEnding
    from flows._provenance._sql import Reader

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
T = TypeVar("T")


def _say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _state_dir() -> Path:
    return state_dir_from(None, os.environ)


def _runner_pid_file() -> Path:
    return _state_dir() / "runner.pid"


def _runner_lock_file() -> Path:
    return _state_dir() / "runner.lock"


def _runner_serving_file() -> Path:
    """The pid of the runner once it serves (``serve_foreground``); removed as it stops."""
    return _state_dir() / "runner.serving"


def _runner_log() -> Path:
    return _state_dir() / "runner.log"


class RunnerError(UnattendedError):
    """The runner of this state directory did not start serving, or stopped serving."""

    code = "internal"


# ``runner_alive`` probes the lock with a shared lock held for an instant; an exclusive
# attempt that meets a probe is asked again, while a runner holds it for its lifetime.
_LOCK_PATIENCE_SECONDS = 1.0


def _lock_runner(path: Path) -> int | None:
    """Take the runner's lock for this process's lifetime; None when another runner holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    give_up = time.monotonic() + _LOCK_PATIENCE_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= give_up:
                os.close(fd)
                return None
            time.sleep(0.01)
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd  # kept open (and locked) until the process exits, however it exits


def _run_link(flow_run_id: object) -> str:
    return flow_run_ui_url(ui_url(), flow_run_id)


def _parse_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise ValidationFailed(f"'{text}' is not a flow run id", details={"field": "run"}) from None


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
            Path(spec), site_arg, _state_dir(), pid, accept_changes=accept_changes
        )
        if submitted is not None:
            return submitted
    from flows._prefect._service import submit_campaign

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
        location = campaign_dir(_state_dir(), name)
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
    print(f"  UI: {_run_link(submitted.flow_run_id)}")
    if not runner_alive():
        print(
            "  note: no runner is serving on this node; start one with 'unattended serve --detach'"
        )


def nudge() -> None:
    """Wake this state directory's runner, so it picks up a new or resumed run now."""
    from flows._prefect._nudge import nudge_runner

    pid = runner_pid()
    if pid is not None:
        nudge_runner(pid)


def runner_pid() -> int | None:
    """Return the pid of the runner that serves this state directory, if one does."""
    return _runner_pid() if runner_alive() else None


def runner_alive() -> bool:
    """Return whether a runner holds this state directory's lock (it does for its lifetime)."""
    path = _runner_lock_file()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own shared lock
    return False


def _runner_pid() -> int | None:
    try:
        return int(_runner_lock_file().read_text().strip())
    except (OSError, ValueError):
        return None


def runner_serving() -> int | None:
    """Return the pid of this state directory's runner once it serves (polls), else None."""
    pid = runner_pid()
    if pid is None:
        return None
    try:
        said = int(_runner_serving_file().read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if said == pid else None


def runner_log_tail() -> str:
    """Return the last line the runner logged (what it died of, usually), or a placeholder."""
    try:
        with _runner_log().open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no runner log)"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last or "(the runner log is empty)"


def start_detached_runner(query_seconds: float = 1.0) -> int:
    """Start ``unattended serve`` in its own session; return its pid once it serves.

    The runner runs apart from the caller's folder and user site (``python_argv``)
    from its private folder under the state directory (``runner_dir``). Idempotent
    (cron, scrontab): a runner that holds the lock is left alone and its pid returned
    once it serves; two starts racing each other end with one runner, because the
    second one cannot take the lock and exits.

    Raises:
        RunnerError: The runner exited before it served (the message ends with
            the last line of its log), or did not serve within
            ``UNATTENDED_RUNNER_START_SECONDS`` (it is stopped then).
    """
    connect(start=False)
    process = None
    if not runner_alive():
        home = _state_dir()
        with os.fdopen(append_private(_runner_log()), "ab") as handle:
            process = subprocess.Popen(
                python_argv("-m", "flows._cli", "serve", "--query-seconds", str(query_seconds)),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                cwd=runner_dir(home),
                start_new_session=True,
                umask=PRIVATE_UMASK,  # what its flow runs write under the state directory
            )
        write_private(_runner_pid_file(), str(process.pid))
    return _until_serving(process)


# How often a starting runner is looked at.
_START_POLL_SECONDS = 0.1


def _until_serving(process: subprocess.Popen[bytes] | None) -> int:
    """Return the serving runner's pid; raise ``RunnerError`` if none will serve."""
    from flows._settings import Settings

    seconds = Settings.from_env(os.environ).runner_start_seconds
    give_up = time.monotonic() + seconds
    while True:
        pid = runner_serving()
        if pid is not None:
            return pid
        exited = process.poll() if process is not None else None
        # No runner holds the lock and ours (if any) has exited: none will serve. Ours
        # exited while another holds it: it lost a race to that one, which is waited for.
        if (exited is not None or process is None) and not runner_alive():
            which = (
                f"the runner exited (status {exited})"
                if process is not None
                else "the runner another start began exited"
            )
            raise RunnerError(
                f"{which} before it served; the last line of {_runner_log()}: {runner_log_tail()}",
                details={"log": str(_runner_log()), "exit_status": exited},
            )
        if time.monotonic() >= give_up:
            if process is not None:
                _stop_started(process)
            raise RunnerError(
                f"the runner did not serve within {seconds:g} s (UNATTENDED_RUNNER_START_SECONDS)"
                f"{'; it was stopped' if process is not None else ''}; the last line of "
                f"{_runner_log()}: {runner_log_tail()}",
                details={"log": str(_runner_log()), "seconds": seconds},
            )
        time.sleep(_START_POLL_SECONDS)


def _stop_started(process: subprocess.Popen[bytes]) -> None:
    """Stop a runner this command started that never served: its whole process group."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
            return


def ensure_runner() -> None:
    """Start the background runner unless one already serves this state directory."""
    if not runner_alive():
        pid = start_detached_runner()
        print(f"started the runner in the background (pid {pid}); log: {_runner_log()}")


def stop_runner() -> bool:
    """Stop the background runner (before the server: the other order hangs)."""
    path = _runner_pid_file()
    pid = _runner_pid()
    if not runner_alive() or pid is None:
        path.unlink(missing_ok=True)
        return False
    os.killpg(pid, signal.SIGTERM)
    # Done when the lock is free (the runner has exited), not when its pid is gone: an
    # exited runner stays a zombie until init reaps it, and the next `serve` needs the lock.
    if not _until_unlocked(20.0):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _until_unlocked(10.0)
    path.unlink(missing_ok=True)
    return True


def _until_unlocked(seconds: float) -> bool:
    """Wait until no runner holds this state directory's lock; False if one still does."""
    give_up = time.monotonic() + seconds
    while runner_alive():
        if time.monotonic() >= give_up:
            return False
        time.sleep(0.05)
    return True


# Flow-run processes inherit the runner's environment. The surrogate's matrices are
# small; threaded BLAS on a shared login node only contends (2-4x slower measured).
_SINGLE_THREADED_BLAS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


# Printed to the runner's log once Prefect's event stream is connected.
LISTENING_LINE = "woken by Prefect's event stream when a run is resumed or scheduled"
# Printed to the runner's log once it polls for runs.
SERVING_LINE = "serving: the runner polls for due runs"


def serve_foreground(query_seconds: float) -> int:
    """Serve campaign runs until SIGTERM or Ctrl-C."""
    from flows._prefect._nudge import NUDGE_SIGNAL

    # A nudge before the runner listens (it imports for seconds) must not end it: the
    # signal's default action is to terminate. The command then submits by itself.
    signal.signal(NUDGE_SIGNAL, signal.SIG_IGN)
    connect(start=False)
    for variable in _SINGLE_THREADED_BLAS:
        os.environ.setdefault(variable, "1")
    from flows._prefect._service import CampaignService

    # Flow runs inherit it: telemetry, work folders and Prefect's own files stay private.
    os.umask(PRIVATE_UMASK)
    _leave_callers_folder()
    if _lock_runner(_runner_lock_file()) is None:
        print(f"a runner already serves {_state_dir()} (pid {_runner_pid()}); nothing to do")
        return 0
    # Flow runs inherit it: a failpoint scoped to the runner kills the whole tree.
    os.environ["UNATTENDED_RUNNER_PID"] = str(os.getpid())
    path = _runner_pid_file()
    write_private(path, str(os.getpid()))
    print(f"serving campaign runs from {os.environ.get('PREFECT_API_URL')}", flush=True)
    serving = _runner_serving_file()

    def say_serving() -> None:
        # What a starting `serve --detach`, `up` or `run` waits for (``runner_serving``).
        write_private(serving, str(os.getpid()))
        print(SERVING_LINE, flush=True)

    try:
        asyncio.run(
            CampaignService(query_seconds=query_seconds).serve(
                on_listening=lambda: print(LISTENING_LINE, flush=True), on_serving=say_serving
            )
        )
    except KeyboardInterrupt:
        pass
    finally:
        for mine in (path, serving):
            with contextlib.suppress(OSError):
                if mine.read_text().strip() == str(os.getpid()):
                    mine.unlink()
    return 0


def _leave_callers_folder() -> None:
    """Work from the runner's private folder, with the caller's folder off ``sys.path``.

    A runner started by hand (``unattended serve`` in a shared folder) would otherwise
    hand that folder to what it starts: multiprocessing's forkserver and spawned flow
    runs put their working folder first on ``sys.path``, Prefect's ``python -m
    prefect.engine`` too, and ``python -m flows._cli`` put it there for this process.
    """
    try:
        caller = os.getcwd()
    except OSError:  # a folder removed since: nothing of it can be imported
        caller = ""
    os.chdir(runner_dir(_state_dir()))
    # Only the first entry: where ``-m`` and ``-c`` put it. The same folder further on
    # came from the installation (an editable install's .pth) and stays.
    if sys.path and sys.path[0] in ("", ".", caller):
        del sys.path[0]


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
                            _print_how_to_approve(
                                flow_run.id, _registered(flow_run) or {}, _pause_key(flow_run)
                            )
                    last = name
                if name == "PAUSED" and not wait_for_approval:
                    return STATUS_EXIT["awaiting_approval"]
                if name in TERMINAL:
                    break
                time.sleep(1.0)
        if name not in TERMINAL:
            return _runner_died(flow_run, watched)
        return _final(flow_run)
    except KeyboardInterrupt:
        print(
            f"\nstopped following; the campaign goes on. Follow it again with "
            f"'unattended status {flow_run_id}' or 'unattended run' on the same spec.",
            file=sys.stderr,
        )
        return 130


def _runner_died(flow_run: FlowRun, pid: int | None) -> int:
    """Say that the runner stopped under a run that goes on; return the failure status."""
    state = flow_run.state.name if flow_run.state else "UNKNOWN"
    return fail(
        f"the runner (pid {pid}) died (or was stopped) while flow run {flow_run.id} was "
        f"{state}; nothing "
        f"runs it until a runner serves this state directory again ('unattended serve "
        f"--detach'; 'unattended status {flow_run.id}' shows the run). The last line of "
        f"{_runner_log()}: {runner_log_tail()}",
        EXIT_FAILED,
    )


def _final(flow_run: FlowRun) -> int:
    """Print how the run ended; return the exit code of its recorded ending.

    The ending the flow recorded in the provenance says it (``run_ending``); a run that
    recorded none (killed, or forced through the API) failed, as far as ``run`` knows.
    """
    state = flow_run.state
    message = (state.message or "") if state else ""
    print(f"finished: {state.name if state else '?'} {message}".rstrip())
    ending = _recorded_ending(flow_run)
    if ending is None:
        return STATUS_EXIT["failed"]
    return next(
        (code for status, code in STATUS_EXIT.items() if status == ending.status),
        STATUS_EXIT["failed"],
    )


def _pause_key(flow_run: FlowRun) -> str:
    state = flow_run.state
    return (state.state_details.pause_key if state else None) or ""


def _pending_or_none(parameters: Mapping[str, Any], pause_key: str) -> PendingApproval | None:
    """Return what a waiting run asks for, or None when its provenance cannot tell."""
    from flows._prefect._pending import describe_pending

    try:
        return describe_pending(parameters, pause_key, os.environ)
    except Exception:  # noqa: BLE001  # the hint is best effort; the run state is what matters
        return None


def _print_how_to_approve(flow_run_id: UUID, parameters: Mapping[str, Any], pause_key: str) -> None:
    pending = _pending_or_none(parameters, pause_key)
    print("  the campaign waits for approval")
    if pending is not None:
        print(f"  rule: {pending.rule}; approvers: {', '.join(pending.approvers) or '-'}")
        if pending.deadline:
            print(f"  answer by {pending.deadline.isoformat(timespec='seconds')}")
    print(f"  in the Prefect UI: {_run_link(flow_run_id)}  (menu > Resume)")
    print(
        f"  or: unattended approve {flow_run_id} --as NAME [--reject] [--comment TEXT]", flush=True
    )


# status, approvals and approve speak Prefect's REST API directly (flows._prefect._rest):
# importing Prefect's client alone costs about a second.


def show_runs(*, as_json: bool = False) -> int:
    """List recent campaign runs (as one JSON document with ``as_json``)."""
    connect(start=False)
    from flows._prefect import _rest as rest

    # Only this state directory's campaigns, asked of the server by their deployments:
    # another user's runs (one server, the same campaign names, perhaps) are theirs to
    # see, and never use up the limit. The newest runs, then every older one still active.
    mine = _my_deployments()
    found = rest.filter_runs(os.environ, deployment_ids=mine, limit=_RECENT_RUNS)
    shown = {run.id for run in found}
    older = rest.filter_runs(
        os.environ, deployment_ids=mine, state_types=_ACTIVE_STATES, limit=None
    )
    found += [run for run in older if run.id not in shown]
    seen: set[str] = set()
    listed: list[tuple[RunView, str | None]] = []
    for run in found:
        newest = run.campaign not in seen
        seen.add(run.campaign)
        asked = newest or run.state_type in {"RUNNING", "PENDING"}
        listed.append((run, _recovery(run, ours=True) if asked else None))
    if as_json:
        print_json({"runs": [_run_json(run, note) for run, note in listed]})
        return 0
    if not found:
        print("no campaign runs")
    else:
        print(f"{'flow run':<36}  {'campaign':<24} {'state':<12} UI")
    for run, note in listed:
        print(f"{run.id}  {run.campaign:<24} {run.state_name:<12} {_run_link(run.id)}")
        if note:
            print(f"  {note}")
    return 0


# Only a run in one of these states can be about to be recovered (orphaned, ended by a
# crash, a runner's shutdown or storage, or a cancel nobody stops): the others are shown
# without Prefect.
_RECOVERABLE_STATES = frozenset(
    {"RUNNING", "PENDING", "CRASHED", "CANCELLED", "CANCELLING", "FAILED"}
)


def _recovery(run: RunView, *, ours: bool = False) -> str | None:
    """Say when and why the watchdog is about to recover this run's campaign, if it is.

    ``ours``: the caller already knows the run is a campaign of this state directory.
    """
    if run.state_type not in _RECOVERABLE_STATES:
        return None
    # The watchdog recovers the campaigns registered in its own state directory only, so
    # a run of another state directory (another user's, say) gets no note here either.
    if not ours and _registered(run) is None:
        return None
    if run.state_type == "RUNNING" and _holds_live_lease(run):
        return None  # the watchdog leaves it alone (orphan_reason); no Prefect to say so
    from flows._prefect._recovery_note import recovery_note_of

    return recovery_note_of(run.id, runner_alive=runner_alive()) or None


def _read_record(run: Any, read: Callable[[Reader, str], T]) -> T | None:
    """Return ``read(reader, campaign)`` on the provenance of ``run``'s campaign, or None.

    Read from the provenance (stdlib ``sqlite3``) and the owner's registration (which
    names the campaign and its site: loading the spec for them would import the
    planners); None when the run is not a campaign of this state directory or its
    database cannot be read now.
    """
    from flows._engine._registration import registration_for
    from flows._paths import campaign_dir, state_dir_from
    from flows._provenance._sqlite import open_read_only
    from tasks import load_site

    found = registration_for(state_dir_from(None, os.environ), run.deployment_id)
    if found is None:
        return None
    try:
        site = load_site(found.site, env=os.environ)
        url = site.provenance_url
        home = Path(found.state_dir)
        where = url.get_secret_value() if url else campaign_dir(home, found.campaign)
        store = open_read_only(where)
    except Exception:  # noqa: BLE001  # no site or no database: nothing recorded to read
        return None
    try:
        with store.reading() as reader:
            return read(reader, found.campaign)
    except Exception:  # noqa: BLE001  # unreadable now: as if nothing were recorded
        return None
    finally:
        store.close()


def _recorded_ending(run: Any) -> RunEnding | None:
    """Return how ``run`` ended as its flow recorded it (``run_ending``), None if unknown."""
    from flows._provenance._readers import run_endings

    endings = _read_record(run, run_endings)
    return None if endings is None else endings.get(str(run.id))


def _holds_live_lease(run: RunView) -> bool:
    """Return whether ``run`` holds its campaign's lease, alive and unexpired.

    Such a run is never an orphan and nothing recovers it, so ``status`` has nothing to
    say of it: read from the provenance (``_read_record``), this spares the Prefect
    client ``recovery_note_of`` needs (its import alone took 1.5 s, and each run a
    client and a store: ``status`` took 5.3 s with 24 campaigns running). Any doubt (no
    record, no registration, an unreadable database) says False: the watchdog's own
    rules judge the run then.
    """
    from flows._provenance._readers import lease

    held = _read_record(run, lease)
    return (
        held is not None
        and held.owner == str(run.id)
        and not held.expired()
        and not held.holder_gone()
    )


def print_json(document: Mapping[str, Any]) -> None:
    """Print ``document`` as the command's only output (``--json``): stable keys, ISO times."""
    import json

    print(json.dumps(document, indent=2, default=_json_value))


def _json_value(value: object) -> object:
    from datetime import datetime

    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _run_json(run: RunView, recovery: str | None) -> dict[str, Any]:
    """Return what ``status`` shows of a run, as JSON."""
    return {
        "id": str(run.id),
        "name": run.name,
        "campaign": run.campaign,
        "state_type": run.state_type,
        "state": run.state_name,
        "message": run.state_message or None,
        "ui_url": _run_link(run.id),
        "recovery": recovery,
    }


def _approval_json(run: RunView, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Return what a waiting run asks for, and how to answer, as JSON (unknown fields null)."""
    pending = _pending_or_none(parameters, run.pause_key)
    return {
        "flow_run_id": str(run.id),
        "campaign": pending.campaign if pending else run.campaign,
        "key": pending.key if pending else None,
        "rule": pending.rule if pending else None,
        "approvers": pending.approvers if pending else [],
        "requested_at": pending.requested_at if pending else None,
        "deadline": pending.deadline if pending else None,
        "on_timeout": pending.on_timeout if pending else None,
        "ui_url": _run_link(run.id),
        "approve": f"unattended approve {run.id} --as NAME",
    }


def show_run(run: str, *, as_json: bool = False) -> int:
    """Show one run's state and, when it waits, how to approve it."""
    connect(start=False)
    from flows._prefect import _rest as rest

    found = rest.read_run(os.environ, _parse_id(run))
    note = _recovery(found)
    queue = _queue_line(found) if found.state_type == "RUNNING" else ""
    registered = _registered(found)
    if as_json:
        document = _run_json(found, note)
        document["queue"] = queue or None
        document["ours"] = registered is not None
        document["approval"] = (
            _approval_json(found, registered) if registered is not None and found.paused else None
        )
        print_json(document)
        return 0
    print(f"flow run {found.id} ({found.name}): {found.state_name}")
    if found.state_message:
        print(f"  {found.state_message}")
    if note:
        print(f"  {note}")
    print(f"  UI: {_run_link(found.id)}")
    if queue:
        print(f"  {queue}")
    if registered is None:
        print(
            f"  not a campaign of this state directory ({state_dir_from(None, os.environ)}): "
            "its runner and provenance are another user's (or it was made on the server by hand)"
        )
    elif found.paused:
        _print_how_to_approve(found.id, registered, found.pause_key)
    return 0


# ``status`` lists this many of the newest runs, and every older run in these states.
_RECENT_RUNS = 50
_ACTIVE_STATES = ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"]


def _my_deployments() -> dict[str, Mapping[str, Any]]:
    """Return the registered parameters of this state directory's campaigns, by deployment."""
    from flows._engine._registration import registrations
    from flows._paths import state_dir_from

    found = registrations(state_dir_from(None, os.environ))
    return {registration.deployment_id: registration.parameters for registration in found}


def _registered(run: Any) -> Mapping[str, Any] | None:
    """Return the registered parameters of a run of this state directory, None if not ours."""
    from flows._engine._registration import registered_parameters

    return registered_parameters(run.deployment_id, os.environ)


def _queue_line(flow_run: Any) -> str:
    """Return the run's allocation queue line from its provenance, '' when none waits."""
    from flows._cli._progress import open_progress_store, read_queue

    try:
        store, campaign = open_progress_store(flow_run)
    except Exception:  # noqa: BLE001  # no database yet (or unreadable): nothing waits that we know
        return ""
    try:
        return read_queue(store, campaign)
    finally:
        store.close()


def show_approvals(*, as_json: bool = False) -> int:
    """List every run that waits for an approval, with how to answer."""
    connect(start=False)
    from flows._prefect import _rest as rest

    mine = _my_deployments()
    runs = rest.filter_runs(os.environ, state_types=["PAUSED"], deployment_ids=mine, limit=None)
    waiting = [(found, mine[found.deployment_id]) for found in runs if found.deployment_id in mine]
    if as_json:
        print_json({"approvals": [_approval_json(found, params) for found, params in waiting]})
        return 0
    if not waiting:
        print("no approvals pending")
    for found, params in waiting:
        print(f"flow run {found.id} ({found.name})")
        _print_how_to_approve(found.id, params, found.pause_key)
    return 0


_VERDICT_POLL_SECONDS = 0.5


def answer(
    run: str,
    approver: str,
    *,
    reject: bool,
    comment: str,
    batch_size: int | None,
    wait_seconds: float | None,
    code: str | None = None,
    candidates: list[int] | None = None,
) -> int:
    """Answer a run's approval request through the resume API, then report the flow's verdict.

    The server only checks the form; the flow judges the answer (approver, deadline,
    proof) when the run resumes. Unless ``wait_seconds`` is None this waits that long
    for the verdict the flow records and returns 6 (``answer_refused``) if it refused.
    """
    connect(start=False)
    from flows._prefect import _rest as rest

    flow_run_id = _parse_id(run)
    found = rest.read_run(os.environ, flow_run_id)
    if not found.paused:
        raise NotFound(f"flow run {flow_run_id} is not waiting for approval", details={"run": run})
    pending: PendingApproval | None = None
    if wait_seconds is not None:
        from flows._prefect._pending import describe_pending

        # Before resuming: the form's pause key is the handle on the flow's verdict.
        registered = _registered(found)
        if registered is None:
            raise NotFound(
                f"flow run {flow_run_id} is not a campaign of this state directory "
                f"({state_dir_from(None, os.environ)}); answer it from the Prefect UI, or "
                "with --no-wait (its verdict is recorded in its owner's provenance)",
                details={"run": run},
            )
        pending = describe_pending(registered, found.pause_key, os.environ)
    rest.approve(
        os.environ,
        flow_run_id,
        approver=approver,
        reject=reject,
        comment=comment,
        batch_size=batch_size,
        code=code,
        candidates=candidates,
    )
    nudge()
    if pending is None or wait_seconds is None:
        print(
            f"answer sent; the flow judges it when the run resumes "
            f"(see 'unattended status {flow_run_id}')"
        )
        return 0
    if not runner_alive():
        return fail(
            "answer sent, but no runner serves this state directory, so nothing judges it "
            f"yet: 'unattended serve --detach' starts one ('unattended status {flow_run_id}' "
            "shows the run)",
            EXIT_FAILED,
        )
    print("answer sent; waiting for the flow's verdict ...", flush=True)
    event, ended = _await_verdict(pending, wait_seconds, flow_run_id)
    if event is None and ended is not None:
        # The run ended before judging the answer (its inputs changed since it was pinned,
        # say): the answer was not judged, and the run's recorded ending says why.
        ending = _recorded_ending(ended)
        return fail(
            f"no verdict: the run ended {ended.state_name} before judging the answer"
            + (f" ({ending.status}, {ending.code})" if ending is not None else "")
            + (f": {ended.state_message}" if ended.state_message else "")
            + f" ('unattended status {flow_run_id}' shows the run)",
            EXIT_BAD_INPUT if ending is not None and ending.code == "spec_changed" else EXIT_FAILED,
        )
    if event is None:
        return fail(
            f"no verdict from the flow within {wait_seconds:g} s; the answer is on the server and "
            f"is judged when a runner resumes the run ('unattended serve --detach' starts one; "
            f"'unattended status {flow_run_id}' shows the run)",
            EXIT_FAILED,
        )
    return _report_verdict(event, pending)


# States a run leaves an answer unjudged in: it will not judge it any more.
_ENDED_STATES = frozenset({"FAILED", "CRASHED", "CANCELLED", "COMPLETED"})


def _await_verdict(
    pending: PendingApproval, wait_seconds: float, flow_run_id: UUID
) -> tuple[ApprovalEventRecord | None, RunView | None]:
    """Wait for the flow's verdict on the answer; also return the run if it ended without one."""
    from flows._prefect import _rest as rest
    from flows._prefect._pending import answer_event

    deadline = time.monotonic() + wait_seconds
    while True:
        event = answer_event(pending)
        if event is not None or time.monotonic() >= deadline:
            return event, None
        run = rest.read_run(os.environ, flow_run_id)
        if run.state_type in _ENDED_STATES:
            return answer_event(pending), run  # a verdict recorded just before the end counts
        time.sleep(_VERDICT_POLL_SECONDS)


def _report_verdict(event: ApprovalEventRecord, pending: PendingApproval) -> int:
    """Print what the flow made of the answer; return 0, or 6 if it refused it."""
    by = event.decided_by or "?"
    if event.decision == "approved":
        overrides = event.overrides if isinstance(event.overrides, dict) else {}
        size = overrides.get("batch_size")
        subset = overrides.get("candidates")
        part = (
            f"candidates {', '.join(map(str, subset))} (the others are struck)"
            if subset
            else f"its first {size} candidates"
            if size
            else "the proposed batch"
        )
        print(f"approved by {by}: the flow accepted the answer and runs {part}")
        return 0
    if event.decision == "rejected":
        print(
            f"rejected by {by}: the flow accepted the answer; the campaign stops "
            "(blocked, approval_rejected)"
        )
        return 0
    refused = EXIT_ANSWER_REFUSED
    if event.decision == "timeout":
        deadline = pending.deadline.isoformat(timespec="seconds") if pending.deadline else "?"
        then = (
            "it runs the deterministic fallback batch"
            if pending.on_timeout == "fallback"
            else "it stopped (blocked, approval_timeout)"
        )
        return fail(
            f"refused: the answer arrived after the deadline ({deadline}); the campaign follows "
            f"its timeout policy: {then}",
            refused,
        )
    if event.refusal is not None:
        why = {
            "override_not_allowed": "this rule allows no override (max_batch_override = false); "
            "approve the whole batch, or reject",
            "override_ambiguous": "an answer gives a batch size or candidates, not both",
            "override_out_of_range": "the override names candidates the batch does not have",
            "unreadable": "the answer could not be read as the form's",
        }.get(event.refusal, event.refusal)
        return fail(f"refused: {why}; nothing ran and the run waits again", refused)
    if event.proof is not None:
        why = {
            "totp failed": "the one-time code was wrong (or from another 30 s window)",
            "totp replayed": "the one-time code was used already; wait for the next one",
            "totp missing": "this rule requires your one-time code (--code)",
            "totp not enrolled": f"{by!r} has no one-time code enrolled on this node "
            "('unattended approver add')",
            "totp secret exposed": f"{by!r}'s secret file is readable by other users, so a "
            "code proves nothing; re-enrol with 'unattended approver add --replace'",
        }.get(event.proof, event.proof)
        return fail(
            f"refused: {why}; nothing ran and the run waits again for an answer with proof",
            refused,
        )
    allowed = ", ".join(pending.approvers) or "-"
    return fail(
        f"refused: {by!r} is not an allowed approver of rule {pending.rule} (allowed: {allowed}); "
        "nothing ran and the run waits again for an allowed approver",
        refused,
    )
