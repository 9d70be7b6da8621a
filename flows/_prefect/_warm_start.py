"""Start flow-run processes forked from a warm, pre-imported parent.

A served flow run starts in a fresh ``spawn`` process that imports Prefect, the
round engine, numpy and SQLAlchemy: 2-3 s of CPU on the login node before round
0, and again on every resume after an approval. ``enable_warm_start`` makes the
runner start them from a ``multiprocessing`` *forkserver* instead: one
single-threaded process, started with the runner, imports
``flows._prefect._campaign`` once and forks a child for each flow run. The child
runs exactly what Prefect's own ``run_flow_in_subprocess`` runs (same
environment, settings context, control channel and signal handling); only the
process start differs.

Correctness under signals and crashes: the forkserver exits when the runner's end
of its pipe closes (the runner died), reaps its children and reports their exit
codes; it ignores SIGTERM, so a SIGTERM to the runner's process group leaves it
there to report the exit codes of the runs the runner cancels; a forkserver that
died is started again on the next run. Children stay in the runner's process
group, so ``unattended serve --stop`` reaches them as before. Code upgraded on
disk is seen by new runs only after the runner restarts (as for the flow object
the runner already holds).

This module touches Prefect internals (``prefect.runner._starter_direct``'s
documented patch point, and the helpers ``run_flow_in_subprocess`` is made of):
written against Prefect 3.9; ``enable_warm_start`` refuses other minor versions
and the runner falls back to Prefect's spawn.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, cast

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from prefect.client.schemas.objects import FlowRun
    from prefect.flows import Flow

# What every campaign run imports: the flow, the engine, numpy, SQLAlchemy, and what the
# run imports on its way to round 0 (asyncflow when the executor starts, Alembic when the
# store opens, CEL when the policy loads): measured ~1 s of CPU at rest, 6 s at load 17.
# None of them starts a thread or installs a signal handler on import.
PRELOAD: Final = (
    "flows._prefect._campaign",
    "radical.asyncflow",
    "alembic.command",
    "alembic.runtime.environment",
    "alembic.runtime.migration",
    "cel",
    "sqlalchemy.dialects.sqlite",
)
SUPPORTED_PREFECT: Final = ("3.9.",)
# Set to 0 to start every flow run in a fresh spawned process, as Prefect does.
ENV_SWITCH: Final = "UNATTENDED_WARM_START"

_log = logging.getLogger(__name__)

# The flow runs this process forked, by id. A forked child's environment is set after
# the fork, so /proc/PID/environ (what a spawned child's PREFECT__FLOW_RUN_ID is read
# from) still shows the forkserver's: the runner's watchdog asks here instead.
_STARTED: dict[str, BaseProcess] = {}


def flow_runs_started_here() -> set[str]:
    """Return the ids of the flow runs this process forked whose process still runs."""
    for run_id, process in list(_STARTED.items()):
        if not process.is_alive():
            del _STARTED[run_id]
    return set(_STARTED)


def warm_start_wanted(env: dict[str, str] | os._Environ[str]) -> bool:
    """Return whether the environment leaves warm start on (the default)."""
    return env.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def enable_warm_start(preload: Iterable[str] = PRELOAD) -> bool:
    """Make this process's runners fork flow runs from a pre-imported forkserver.

    Starts the forkserver now (it imports ``preload`` in the background), so the
    first run finds it warm. Returns False, changing nothing, on a Prefect
    version this was not written against.
    """
    import prefect
    from prefect.runner import _starter_direct

    if not prefect.__version__.startswith(SUPPORTED_PREFECT):
        _log.warning(
            "warm start is written for Prefect %s, found %s; flow runs start cold",
            "/".join(SUPPORTED_PREFECT),
            prefect.__version__,
        )
        return False
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    ensure_forkserver()
    # The patch point Prefect documents for this starter ("patch the module to override").
    _starter_direct.run_flow_in_subprocess = run_flow_in_forkserver  # type: ignore[attr-defined,assignment]
    return True


def ensure_forkserver() -> None:
    """Start the forkserver if it is not running, deaf to SIGTERM.

    ``unattended serve --stop`` (and Slurm, and tests) SIGTERM the runner's whole
    process group. The runner then cancels its runs and waits for their exit
    codes, which a forkserver reports: it must outlive that signal. It still ends
    with the runner (its pipe to the runner closes). The ignored disposition is
    inherited across ``exec``; the forked child puts the default back first.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_flow_in_forkserver(
    flow: Flow[..., Any],
    flow_run: FlowRun | None = None,
    parameters: dict[str, Any] | None = None,
    wait_for: Any = None,
    context: dict[str, Any] | None = None,
    env: dict[str, str | None] | None = None,
) -> BaseProcess:
    """Do what ``prefect.flow_engine.run_flow_in_subprocess`` does, in a forked child."""
    from prefect import flow_engine as engine
    from prefect.context import serialize_context
    from prefect.settings.context import get_current_settings
    from prefect.utilities.callables import cloudpickle_wrapped_call
    from prefect.utilities.processutils import sanitize_subprocess_env

    merged_env: dict[str, str | None] = {}
    merged_env.update(get_current_settings().to_environment_variables(exclude_unset=True))
    merged_env.update(os.environ)
    merged_env["PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS"] = "false"
    merged_env.update(env or {})
    sanitized = sanitize_subprocess_env(merged_env)
    startup_env = {k: v for k, v in sanitized.items() if k in engine._CONTROL_CHANNEL_ENV_KEYS}
    wrapped_call: Any = cloudpickle_wrapped_call(
        _run_flow_with_env,
        env=engine._runtime_subprocess_env(sanitized),
        remove_env={key for key, value in merged_env.items() if value is None},
        flow=flow,
        flow_run=flow_run,
        parameters=parameters,
        wait_for=wait_for,
        context=context or serialize_context(),
    )
    ensure_forkserver()  # started again if it died
    process = multiprocessing.get_context("forkserver").Process(
        target=engine._run_serialized_call_with_control_bootstrap,
        args=(cast(bytes, wrapped_call.args[0]), startup_env),
    )
    process.start()
    if flow_run is not None:
        _STARTED[str(flow_run.id)] = process
    return process


def _run_flow_with_env(
    *args: Any,
    env: dict[str, str] | None = None,
    remove_env: set[str] | None = None,
    **kwargs: Any,
) -> None:
    """Set the run's environment and settings, then run the flow (in the child)."""
    import asyncio

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forkserver ignores it; a run must not

    from prefect import flow_engine
    from prefect.context import SettingsContext, get_settings_context
    from prefect.engine import handle_engine_signals
    from prefect.flow_engine import run_flow
    from prefect.settings.models.root import Settings

    if env is not None:
        # The runner's environment now, as a spawned child would get it: not what the
        # forkserver inherited when it started (a variable unset since stays unset).
        keep = set(env) | set(flow_engine._CONTROL_CHANNEL_ENV_KEYS)
        for key in [key for key in os.environ if key not in keep]:
            del os.environ[key]
    for key in remove_env or ():
        os.environ.pop(key, None)
    os.environ.update(env or {})
    settings_context = get_settings_context()
    try:
        with SettingsContext(profile=settings_context.profile, settings=Settings()):
            flow_run = kwargs.get("flow_run")
            with handle_engine_signals(getattr(flow_run, "id", None)):
                outcome = run_flow(*args, **kwargs)
                if asyncio.iscoroutine(outcome):
                    asyncio.run(outcome)
    finally:
        # A forkserver child leaves by os._exit, which skips the exit handlers a
        # spawned child runs at interpreter exit (logging.shutdown, Prefect's
        # service drains, OpenTelemetry's shutdown). Run them here, as it would.
        atexit._run_exitfuncs()
