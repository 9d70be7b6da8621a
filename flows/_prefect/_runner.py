"""Serve flows as deployments from the login node, with polling tuned for approvals.

A suspended flow run only continues when a runner picks up the rescheduled
run, so the runner polls the API every ``RUNNER_QUERY_SECONDS`` (Prefect's
default is 10 s), and ``wake_on_events`` makes it look at once when Prefect's
event stream announces a resumed or new run. Suspension needs a deployment:
``deploy_flow`` registers one that this runner serves, ``serve`` runs a runner
until it is told to stop, and ``drive_once`` / ``adrive_once`` run one
poll-and-execute cycle (tests).

Stop the runner before the server: the other order hangs for minutes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from prefect.runner import Runner
from prefect.types.entrypoint import EntrypointType
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    retry_if_result,
    stop_never,
)

from flows._paths import private_dir
from flows._prefect._nudge import NUDGE_SIGNAL
from flows._prefect._warm_start import enable_warm_start, warm_start_wanted

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.client.schemas.objects import FlowRun

# Seconds between the runner's queries for scheduled runs: a resumed run waits at most this
# when Prefect's event stream cannot be reached (``wake_on_events``).
RUNNER_QUERY_SECONDS: Final[float] = 1.0
# What makes a flow run due now: a resume (the UI's form, ``unattended approve``, the
# approval watchdog) and a new run (``unattended submit``, the UI's "Run").
WAKE_EVENTS: Final = ("prefect.flow-run.Resuming", "prefect.flow-run.Scheduled")
# Longest wait between two attempts to reach the event stream.
_EVENTS_RETRY_MAX_SECONDS: Final = 60.0
# An event can arrive before its state is committed: read the run until it shows.
_COMMIT_WAIT_SECONDS: Final = 2.0
_COMMIT_POLL_SECONDS: Final = 0.02

_log = logging.getLogger(__name__)


def make_runner(
    *,
    name: str | None = None,
    query_seconds: float = RUNNER_QUERY_SECONDS,
    limit: int | None = None,
    warm_start: bool | None = None,
    storage_dir: Path | None = None,
) -> Runner:
    """Return a ``Runner`` that polls every ``query_seconds`` and never pauses deployments.

    Args:
        name: The runner's name (no ``/`` or ``%``); random when None.
        query_seconds: Seconds between queries for scheduled (or resumed) runs.
        limit: Most flow runs executing at once; None for no limit.
        warm_start: Fork flow runs from a pre-imported process
            (``flows._prefect._warm_start``); None reads ``UNATTENDED_WARM_START``
            (on unless ``0``).
        storage_dir: A private folder (made 0700) for the runner's storage, instead of
            Prefect's ``$TMPDIR/runner_storage`` (``keep_storage_in``).
    """
    if not query_seconds > 0:
        raise ValueError("query_seconds must be > 0")
    if warm_start if warm_start is not None else warm_start_wanted(os.environ):
        enable_warm_start()
    # pause_on_shutdown would mark our deployments paused every time a runner stops.
    runner = Runner(name=name, query_seconds=query_seconds, limit=limit, pause_on_shutdown=False)
    if storage_dir is not None:
        keep_storage_in(runner, storage_dir)
    return runner


def keep_storage_in(runner: Runner, folder: Path) -> None:
    """Make ``runner`` keep its storage in ``folder`` (0700), not under ``$TMPDIR``.

    Prefect 3.9's ``Runner`` makes ``$TMPDIR/runner_storage/<uuid>`` when it starts, with
    no parameter or setting to move it: on a shared login node the first user's runner
    owns ``runner_storage`` (0700), and every other user's runner then dies at start
    ("Permission denied"); another user can cause it on purpose. The folder is the
    runner's private ``_tmp_dir`` (set in ``Runner.__init__``, made in ``__aenter__``,
    removed at exit); a Prefect without it is refused rather than left on the shared one.
    """
    current = getattr(runner, "_tmp_dir", None)
    if not isinstance(current, Path):
        raise RuntimeError(
            "this Prefect's Runner has no _tmp_dir (written against Prefect 3.9): its "
            "storage cannot be kept out of the shared $TMPDIR/runner_storage"
        )
    runner._tmp_dir = private_dir(folder) / current.name


def _deployment_options(
    flow: Flow[Any, Any], name: str | None, by_module: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    # A module entrypoint survives a runner restarted from another working
    # directory; a file entrypoint (relative to the cwd) is what test modules need.
    entrypoint = EntrypointType.MODULE_PATH if by_module else EntrypointType.FILE_PATH
    return {"flow": flow, "name": name or flow.name, "entrypoint_type": entrypoint, **extra}


def deploy_flow(
    runner: Runner,
    flow: Flow[Any, Any],
    *,
    name: str | None = None,
    by_module: bool = True,
    **options: Any,
) -> UUID:
    """Register ``flow`` as a deployment this runner serves and return its id.

    Call from synchronous code (``adeploy_flow`` inside an event loop). The
    deployment is named ``<flow name>/<name or flow name>`` for ``run_deployment``.

    Args:
        runner: The runner that will execute the deployment's runs.
        flow: The flow; it must live in an importable module when ``by_module``.
        name: The deployment's name; the flow's name when None.
        by_module: Load the flow by module path (True) or by file path relative
            to the current directory (False, for flows defined in test files).
        options: Passed on to ``Runner.add_flow`` (parameters, tags, description, ...).
    """
    # Runner.add_flow returns a coroutine when an event loop happens to run; be explicit.
    return asyncio.run(adeploy_flow(runner, flow, name=name, by_module=by_module, **options))


async def adeploy_flow(
    runner: Runner,
    flow: Flow[Any, Any],
    *,
    name: str | None = None,
    by_module: bool = True,
    **options: Any,
) -> UUID:
    """Register ``flow`` as a deployment this runner serves (async ``deploy_flow``)."""
    kwargs = _deployment_options(flow, name, by_module, options)
    deployment_id: UUID = await runner.aadd_flow(**kwargs)
    return deployment_id


def serve_existing(runner: Runner, deployment_id: UUID, name: str, flow: Flow[Any, Any]) -> bool:
    """Serve a deployment that exists on the server without writing it again; False if not.

    ``Runner.aadd_flow`` applies the deployment (a write to the server) before serving
    it. A campaign's deployment was applied by its submission and read back by id; one
    more write per campaign is the server's single SQLite writer kept busy for nothing
    (a runner starting with two hundred campaigns wrote all two hundred). This records
    the deployment and its flow in the runner's registry, as ``aadd_deployment`` does
    after its write (Prefect 3.9's ``DeploymentRegistry``, a private part of the
    runner); False when the runner has none, and the caller adds the flow Prefect's way.
    """
    from prefect.runner._deployment_registry import DeploymentRegistry

    registry = getattr(runner, "_deployment_registry", None)
    if not isinstance(registry, DeploymentRegistry):
        return False
    registry.register_deployment(deployment_id, name)
    registry.register_flow(deployment_id, flow)
    return True


async def adrive_once(runner: Runner) -> None:
    """Submit every run that is due now and return when those runs have exited.

    A run that suspends exits its process, so this returns once it is Suspended.
    """
    await runner.start(run_once=True)


def drive_once(runner: Runner) -> None:
    """Run ``adrive_once`` in a fresh event loop (from synchronous code)."""
    asyncio.run(adrive_once(runner))


def serve(
    flows: Iterable[Flow[Any, Any]],
    *,
    name: str | None = None,
    deployment_name: str | None = None,
    query_seconds: float = RUNNER_QUERY_SECONDS,
    limit: int | None = None,
    by_module: bool = True,
) -> None:
    """Deploy ``flows`` and execute their runs until SIGTERM or Ctrl-C.

    Needs ``PREFECT_API_URL`` (see ``client_env``). Each flow gets a deployment
    ``<flow name>/<deployment_name or flow name>``; ``submit`` must use the same
    name so its runs land on this runner. SIGTERM cancels in-flight runs; a
    suspended run is untouched and resumes with the next runner.
    """
    runner = make_runner(name=name, query_seconds=query_seconds, limit=limit)
    for flow in flows:
        deploy_flow(runner, flow, name=deployment_name, by_module=by_module)
    try:
        asyncio.run(runner.start())
    except KeyboardInterrupt:
        # Ctrl-C on a login node is the normal way to stop serving.
        return


class Nudges:
    """Wake a serving runner early when ``NUDGE_SIGNAL`` arrives (install inside its loop)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(NUDGE_SIGNAL, self._event.set)

    async def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return True if nudged meanwhile."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    def close(self) -> None:
        """Stop listening; a late nudge is ignored (its default action would end the process)."""
        self._loop.remove_signal_handler(NUDGE_SIGNAL)
        signal.signal(NUDGE_SIGNAL, signal.SIG_IGN)


async def poll_now(runner: Runner) -> None:
    """Make ``runner`` look for due runs now, not at its next poll (duplicates are skipped)."""
    # The facade's one-poll method; Prefect's poller skips runs it is already submitting,
    # and the server refuses a second Pending for the same run.
    await runner._get_and_submit_flow_runs()  # type: ignore[no-untyped-call]


async def until_released(runner: Runner, flow_run_id: UUID, seconds: float = 30.0) -> None:
    """Wait (at most ``seconds``) until ``runner`` no longer holds ``flow_run_id`` as submitting.

    Prefect's poller skips a run it is still submitting, and it holds a run until the
    run's process has exited and been reported: a resume right after the suspend
    arrives while it still does, and a poll then would not start the resumed run.
    """
    poller = getattr(runner, "_scheduled_run_poller", None)
    held = getattr(poller, "_submitting_flow_run_ids", None)
    if held is None:
        return
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds
    while flow_run_id in held and loop.time() < give_up:  # noqa: ASYNC110  # Prefect's set, no event
        await asyncio.sleep(_COMMIT_POLL_SECONDS)


class PollSoon:
    """Ask a runner to look for due runs now, folding requests that arrive meanwhile into one."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._lock = asyncio.Lock()
        self._again = False

    async def __call__(self) -> None:
        """Poll now, or once more right after the poll in progress (which may predate the run)."""
        if self._lock.locked():
            self._again = True
            return
        async with self._lock:
            self._again = True
            while self._again:
                self._again = False
                await poll_now(self._runner)


async def wake_on_events(
    on_due: Callable[[FlowRun], Awaitable[None]],
    *,
    tag: str,
    retry_seconds: float = 1.0,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Await ``on_due(run)`` whenever a flow run tagged ``tag`` becomes due; return when cancelled.

    A resume from the UI's form reaches no runner by itself: the run turns Scheduled
    (``Resuming``) and waits for the next poll. Prefect's event stream (the websocket
    the UI itself listens to, ``/api/events/out``) announces it within milliseconds,
    so the runner can poll at once. The server publishes the event before it commits
    the state, so ``on_due`` gets the run once the API shows it Scheduled
    (``_when_due``); a run already taken (Pending, Running, finished) is skipped.
    The poll stays the fallback: a stream that cannot be reached (an old server, a
    proxy refusing the upgrade) costs the poll interval and is asked again with
    backoff, never an error; so does a run that became due while the stream was
    away (the server replays only events it has persisted, a few seconds late).
    ``on_listening`` is called each time the stream is connected.
    """
    from prefect.events.clients import get_events_subscriber
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    tagged = f"prefect.tag.{tag}"
    wanted = EventFilter(
        event=EventNameFilter(name=list(WAKE_EVENTS)),
        related=EventRelatedFilter(resources_in_roles=[(tagged, "tag")]),
    )
    waiting: set[asyncio.Task[None]] = set()
    failures = 0

    async def listen() -> None:
        nonlocal failures
        try:
            async with get_events_subscriber(filter=wanted) as subscriber:
                if failures:
                    _log.info("runner: Prefect's event stream is back")
                failures = 0
                if on_listening is not None:
                    on_listening()
                async for event in subscriber:
                    # The live stream applies the name filter but not the related one.
                    if not any(r.id == tagged and r.role == "tag" for r in event.related):
                        continue
                    flow_run_id = UUID(event.resource.id.removeprefix("prefect.flow-run."))
                    task = asyncio.create_task(_when_due(flow_run_id, on_due))
                    waiting.add(task)
                    task.add_done_callback(waiting.discard)
        except Exception as exc:  # the poll covers for the stream meanwhile
            failures += 1
            (_log.warning if failures == 1 else _log.debug)(
                "runner: Prefect's event stream is unavailable (%s); polling every cycle "
                "until it is back",
                type(exc).__name__,
            )
            raise

    try:
        # Budget: none (listened to again until cancelled, a stream that ended too),
        # retry_seconds doubling to 60 s while it fails.
        await AsyncRetrying(
            retry=retry_if_exception_type(Exception) | retry_if_result(lambda _: True),
            stop=stop_never,
            wait=lambda _: min(
                retry_seconds * 2 ** max(failures - 1, 0), _EVENTS_RETRY_MAX_SECONDS
            ),
        )(listen)
    finally:
        for task in waiting:
            task.cancel()


async def _when_due(flow_run_id: UUID, on_due: Callable[[FlowRun], Awaitable[None]]) -> None:
    """Await ``on_due(run)`` once ``flow_run_id`` reads Scheduled; not if it went on without us.

    Before the commit the run still reads Paused (a resume) or does not exist yet (a new
    run). A run already Pending, Running or finished (taken by a poll, or an event
    replayed on reconnecting), one that never shows within ``_COMMIT_WAIT_SECONDS``
    and a server that cannot be read are left to the poll.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    loop = asyncio.get_running_loop()
    give_up = loop.time() + _COMMIT_WAIT_SECONDS
    try:
        async with get_client() as client:
            while loop.time() < give_up:
                try:
                    run = await client.read_flow_run(flow_run_id)
                except ObjectNotFound:
                    run = None
                if run is not None and run.state is not None:
                    if run.state.is_scheduled():
                        break
                    if not run.state.is_paused():
                        return
                await asyncio.sleep(_COMMIT_POLL_SECONDS)
            else:
                return
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001  # a server hiccup: the poll is still there
        _log.debug("runner: reading flow run %s after its event: %s", flow_run_id, exc)
        return
    await on_due(run)
