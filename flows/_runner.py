"""Serve flows as deployments from the login node, with polling tuned for approvals.

A suspended flow run only continues when a runner picks up the rescheduled
run, so the runner polls the API every ``RUNNER_QUERY_SECONDS`` (Prefect's
default is 10 s). Suspension needs a deployment: ``deploy_flow`` registers one
that this runner serves, ``serve`` runs a runner until it is told to stop, and
``drive_once`` / ``adrive_once`` run one poll-and-execute cycle (tests).

Stop the runner before the server: the other order hangs for minutes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from prefect.runner import Runner
from prefect.types.entrypoint import EntrypointType

if TYPE_CHECKING:
    from prefect import Flow

# Seconds between the runner's queries for scheduled runs: a resumed run waits at most this.
RUNNER_QUERY_SECONDS: Final[float] = 1.0


def make_runner(
    *,
    name: str | None = None,
    query_seconds: float = RUNNER_QUERY_SECONDS,
    limit: int | None = None,
) -> Runner:
    """Return a ``Runner`` that polls every ``query_seconds`` and never pauses deployments.

    Args:
        name: The runner's name (no ``/`` or ``%``); random when None.
        query_seconds: Seconds between queries for scheduled (or resumed) runs.
        limit: Most flow runs executing at once; None for no limit.
    """
    if not query_seconds > 0:
        raise ValueError("query_seconds must be > 0")
    # pause_on_shutdown would mark our deployments paused every time a runner stops.
    return Runner(name=name, query_seconds=query_seconds, limit=limit, pause_on_shutdown=False)


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
