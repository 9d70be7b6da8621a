"""The login node's side of a campaign: serve, approve, expire approvals.

A campaign is submitted by ``flows._prefect._deployment.submit_campaign``, which
registers its deployment and starts a flow run. ``CampaignService`` is what
``unattended serve`` runs: a Prefect ``Runner`` that serves every campaign
deployment (it picks up deployments submitted after it started), plus a watchdog
that answers approval requests whose deadline passed, so the campaign follows its
timeout policy instead of waiting forever. ``approve_run`` goes through the same
Prefect resume API as the UI's form.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.runner import Runner
from prefect.types.entrypoint import EntrypointType
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_result,
    stop_never,
    wait_exponential,
    wait_fixed,
)

from flows._engine._approval import SYSTEM_TIMEOUT_APPROVER
from flows._engine._fencing import RecoverySettings
from flows._engine._registration import registered_parameters, registrations
from flows._paths import HOME_VARIABLE, runner_dir, state_dir_from
from flows._prefect import _rest as rest
from flows._prefect._campaign import campaign_flow
from flows._prefect._deployment import ONE_RUN_AT_A_TIME, TAG, campaign_tag, submit_campaign
from flows._prefect._pending import PendingApproval, describe_pending
from flows._prefect._recovery import Watchdog
from flows._prefect._runner import (
    RUNNER_QUERY_SECONDS,
    Nudges,
    PollSoon,
    make_runner,
    poll_now,
    serve_existing,
    until_released,
    wake_on_events,
)
from flows._prefect._submissions import take_submissions
from policies import NotFound, UnattendedError

_log = logging.getLogger(__name__)
# How often a starting runner is looked at until Prefect says it started.
_STARTED_POLL_SECONDS = 0.05
# Longest pause between two looks for a server that went away.
_SERVER_WAIT_MAX_SECONDS = 2.0


class CampaignService:
    """The runner on the login node: serves every campaign deployment, expires approvals.

    Args:
        query_seconds: How often the runner looks for scheduled or resumed runs.
        watch_seconds: How often new deployments and approval deadlines are checked.
        state_dir: Where submissions for this runner arrive; ``$UNATTENDED_HOME`` when None.
    """

    def __init__(
        self,
        *,
        query_seconds: float = RUNNER_QUERY_SECONDS,
        watch_seconds: float | None = None,
        name: str | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self._runner_name = name or "unattended-login-node"
        self._query_seconds = query_seconds
        # Where `unattended submit` leaves requests for this runner (flows._prefect._submissions).
        self.state_dir = state_dir_from(state_dir, os.environ)
        self.runner: Runner = self._make_runner()
        settings = RecoverySettings.from_env(os.environ)
        self.watch_seconds = settings.watchdog_seconds if watch_seconds is None else watch_seconds
        self._own_environment()
        self.watchdog = Watchdog(settings, self.state_dir)
        self._served: set[UUID] = set()

    def _make_runner(self) -> Runner:
        # Its storage in the state directory, never in the login node's shared $TMPDIR.
        storage = runner_dir(self.state_dir) / "storage"
        return make_runner(
            name=self._runner_name, query_seconds=self._query_seconds, storage_dir=storage
        )

    async def sync_deployments(self) -> int:
        """Serve this state directory's registered campaigns not served yet; return how many.

        On a shared server every user's campaigns are deployments tagged ``unattended``
        and anyone holding the secret can create or change one. A runner serves only the
        deployments registered in its own state directory (``flows._engine._registration``),
        with the parameters registered there, never the server's copy: it never runs
        another user's campaign under its own uid, and its start does not grow with
        everybody's deployments. Serving one writes nothing (``serve_existing``): the
        submission applied it, and one read by id finds them all.
        """
        wanted = {
            UUID(r.deployment_id): r
            for r in registrations(self.state_dir)
            if UUID(r.deployment_id) not in self._served
        }
        if not wanted:
            return 0
        async with get_client() as client:
            deployments = await client.read_deployments(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=list(wanted)))
            )
        added = 0
        for deployment in deployments:
            registration = wanted[deployment.id]
            served = serve_existing(
                self.runner, deployment.id, registration.deployment_name, campaign_flow
            )
            if served:
                self._served.add(deployment.id)
                added += 1
                continue
            await self.runner.aadd_flow(
                campaign_flow,
                name=registration.deployment_name,
                parameters=registration.parameters,
                tags=[TAG, campaign_tag(registration.campaign)],
                description=deployment.description,
                entrypoint_type=EntrypointType.MODULE_PATH,
                concurrency_limit=ONE_RUN_AT_A_TIME,
                enforce_parameter_schema=True,
            )
            self._served.add(deployment.id)
            added += 1
        return added

    def _own_environment(self) -> None:
        """Make the flow runs this runner starts inherit its state directory.

        They judge their runs against the registrations of the state directory in
        their environment (``campaign_flow``): the runner's, never a run's.
        """
        os.environ[HOME_VARIABLE] = str(self.state_dir)

    async def run_once(self) -> None:
        """Serve deployments, expire approvals, run what is due now and wait for it (tests)."""
        self._own_environment()
        await self.sync_deployments()
        await expire_approvals()
        await self.runner.start(run_once=True)

    async def serve(
        self,
        on_listening: Callable[[], None] | None = None,
        on_serving: Callable[[], None] | None = None,
    ) -> None:
        """Serve until cancelled (SIGTERM or Ctrl-C); continue what crashed meanwhile.

        ``on_listening`` is called when Prefect's event stream is connected (and again
        after a reconnection): from then on a resume from the UI starts at once.
        ``on_serving`` is called once the runner has started (its storage made, its
        forkserver up) and has asked the server for due runs: it really serves
        (again after the server came back).
        """
        # Submit and approve wake the watch now (flows._prefect._runner). Listen before
        # the first server call: a nudge that came earlier was ignored (SIG_IGN).
        nudges = Nudges()
        self._own_environment()
        try:
            while True:
                try:
                    await self._serve_with(nudges, on_listening, on_serving)
                    return
                except Exception as exc:
                    # Prefect's runner gives up after a few failed polls in a row. A server
                    # that died (or a port another process took: it fails the TLS handshake)
                    # is waited for, and served again once it is back; anything else is an
                    # error of its own.
                    if await self._server_answers():
                        raise
                    _log.warning(
                        "runner: the Prefect server is gone (%s); waiting for it to come back",
                        type(exc).__name__,
                    )
                    await self._wait_for_server()
                    _log.warning("runner: the Prefect server is back; serving again")
                    self.runner = self._make_runner()
                    self._served = set()
        finally:
            nudges.close()

    async def _server_answers(self) -> bool:
        """Return whether this state directory's server answers (and is the one it started)."""
        try:
            await asyncio.to_thread(rest.request, os.environ, "GET", "health")
        except (UnattendedError, OSError):
            return False
        return True

    async def _wait_for_server(self) -> None:
        """Return once the server answers again, looking every second or two."""
        # Budget: none (the runner outlives an outage), 0.5 s doubling to 2 s between looks.
        await AsyncRetrying(
            retry=retry_if_result(lambda answers: not answers),
            stop=stop_never,
            wait=wait_exponential(multiplier=0.5, max=_SERVER_WAIT_MAX_SECONDS),
        )(self._server_answers)

    async def _serve_with(
        self,
        nudges: Nudges,
        on_listening: Callable[[], None] | None,
        on_serving: Callable[[], None] | None,
    ) -> None:
        """Serve with the current runner until it stops (or fails)."""
        await self.sync_deployments()

        async def announce() -> None:
            # Prefect's runner says nothing when it is up: wait for it, then poll once
            # ourselves (what its loop does), so "serving" means a poll went through.
            while not self.runner.started:  # noqa: ASYNC110  # Prefect's flag, no event
                await asyncio.sleep(_STARTED_POLL_SECONDS)

            def say_it_failed(state: RetryCallState) -> None:
                error = state.outcome.exception() if state.outcome is not None else None
                _log.warning("runner: the first poll failed (%s)", type(error).__name__)

            # Budget: none (not serving yet: asked again), every query interval.
            await AsyncRetrying(
                retry=retry_if_exception_type(Exception),
                stop=stop_never,
                wait=wait_fixed(self._query_seconds),
                before_sleep=say_it_failed,
            )(poll_now, self.runner)
            if on_serving is not None:
                on_serving()

        async def intake() -> None:
            # Submissions and approvals' nudges, on their own: a submission waits at most
            # for one campaign's judgement of a sweep in progress (the watchdog's lock),
            # never for the whole sweep, which grows with the campaigns registered.
            nudged = True  # the first pass takes the submissions waiting already
            while not self.runner.stopping:
                try:
                    # Every pass, not only a nudged one: a request whose nudge was lost
                    # (sent while this runner was starting) is taken within a pass.
                    async with self.watchdog.lock:
                        taken = await take_submissions(self.state_dir, submit_campaign)
                    if nudged and not taken and self.runner.started:
                        # An approval's nudge: the resumed run's deployment is served already,
                        # so it starts before the deployments are read again.
                        await poll_now(self.runner)
                    added = await self.sync_deployments()
                    if (taken or added) and self.runner.started:
                        await poll_now(self.runner)
                except Exception as exc:  # noqa: BLE001  # must outlive a server hiccup
                    _log.warning("runner: taking submissions: %s; retrying", type(exc).__name__)
                nudged = await nudges.wait(self.watch_seconds)

        async def watch() -> None:
            while not self.runner.stopping:
                # A runner shutting down leaves its cancelled runs to the next one.
                try:
                    await expire_approvals()
                    for action in await self.watchdog.sweep():
                        _log.warning("watchdog: %s", action)
                except Exception as exc:  # noqa: BLE001  # the watchdog must outlive a server hiccup
                    _log.warning("watchdog: %s; retrying", type(exc).__name__)
                await asyncio.sleep(self.watch_seconds)

        watchers = [
            asyncio.create_task(intake()),
            asyncio.create_task(watch()),
            asyncio.create_task(announce()),
        ]
        poll_soon = PollSoon(self.runner)

        async def due(flow_run: FlowRun) -> None:
            # A resume from the UI (or a new run) of a campaign this runner serves starts
            # now; another runner's runs on a shared server, and new deployments, are the
            # watch's (its nudge, then its pass).
            if self.runner.started and flow_run.deployment_id in self._served:
                await until_released(self.runner, flow_run.id)
                await poll_soon()

        listener = asyncio.create_task(wake_on_events(due, tag=TAG, on_listening=on_listening))
        try:
            await self.runner.start()
        finally:
            for watcher in watchers:
                watcher.cancel()
            listener.cancel()


async def suspended_runs() -> list[FlowRun]:
    """Return every run of this state directory's campaigns that waits for an approval.

    Asked of the server by the campaigns' deployments, page by page: other users' waiting
    runs on a shared server are not read, and a 201st waiting run is not left out
    (Prefect's API returns at most ``rest.PAGE`` runs a request).
    """
    mine = [r.deployment_id for r in registrations(state_dir_from(None, os.environ))]
    if not mine:
        return []
    flow_run_filter = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])),
        tags={"all_": [TAG]},  # type: ignore[arg-type]
        deployment_id=FlowRunFilterDeploymentId(any_=[UUID(d) for d in mine]),
    )
    from prefect.client.schemas.sorting import FlowRunSort

    found: dict[UUID, FlowRun] = {}
    offset = 0
    async with get_client() as client:
        while True:
            page = await client.read_flow_runs(
                flow_run_filter=flow_run_filter,
                sort=FlowRunSort.ID_DESC,  # a stable order for the pages
                limit=rest.PAGE,
                offset=offset,
            )
            for flow_run in page:
                found.setdefault(flow_run.id, flow_run)
            offset += len(page)
            if len(page) < rest.PAGE:
                return list(found.values())


def pending_approval(flow_run: FlowRun) -> PendingApproval:
    """Describe what ``flow_run`` waits for (reads the campaign's provenance).

    Raises:
        NotFound: The run is not a campaign of this state directory: its own
            parameters (anyone holding the secret can write them) say nothing.
    """
    parameters = registered_parameters(flow_run.deployment_id, os.environ)
    if parameters is None:
        raise NotFound(
            f"flow run {flow_run.id} is not a campaign of this state directory",
            details={"flow_run_id": str(flow_run.id)},
        )
    pause_key = (flow_run.state.state_details.pause_key if flow_run.state else None) or ""
    return describe_pending(parameters, pause_key, os.environ)


async def expire_approvals(*, now: datetime | None = None) -> list[UUID]:
    """Answer every request whose deadline passed, so its run follows the timeout policy."""
    moment = now or datetime.now(UTC)
    expired = []
    for flow_run in await suspended_runs():
        try:
            pending = pending_approval(flow_run)
        except UnattendedError:
            continue  # a spec or site that no longer loads: leave the run for a human
        if pending.deadline is not None and moment >= pending.deadline:
            answer = {
                "decision": "reject",
                "approver": SYSTEM_TIMEOUT_APPROVER,
                "comment": "the approval deadline passed",
            }
            if pending.require_proof:
                # The form requires the field; the runner has no code and needs none
                # (the flow judges any answer after the deadline a timeout).
                answer["code"] = ""
            try:
                await resume_with(flow_run.id, answer)
            except UnattendedError as exc:
                # One request the server will not end (answered meanwhile, say) must not
                # keep the others, or the watchdog's sweep after them, from running.
                _log.warning("approval of flow run %s not expired: %s", flow_run.id, exc)
                continue
            expired.append(flow_run.id)
    return expired


async def resume_with(flow_run_id: UUID, run_input: dict[str, Any]) -> None:
    """Resume a suspended run with ``run_input``, exactly as the UI's form does."""
    await asyncio.to_thread(rest.resume, os.environ, flow_run_id, run_input)


async def approve_run(
    flow_run_id: UUID,
    *,
    approver: str,
    reject: bool = False,
    comment: str = "",
    batch_size: int | None = None,
    code: str | None = None,
    candidates: list[int] | None = None,
) -> None:
    """Answer a request as ``approver`` through Prefect's resume API."""
    await asyncio.to_thread(
        rest.approve,
        os.environ,
        flow_run_id,
        approver=approver,
        reject=reject,
        comment=comment,
        batch_size=batch_size,
        code=code,
        candidates=candidates,
    )


async def read_run(flow_run_id: UUID) -> FlowRun:
    """Return a flow run, or raise ``NotFound``."""
    async with get_client() as client:
        try:
            return await client.read_flow_run(flow_run_id)
        except Exception as exc:  # the client raises its own 404 type
            raise NotFound(
                f"no flow run {flow_run_id}", details={"flow_run_id": str(flow_run_id)}
            ) from exc
