"""The campaign as a Prefect flow: one deployment per campaign, approvals by suspend/resume.

On resume Prefect runs the flow function again from the top in a new process.
Everything here is replay-safe because ``CampaignEngine`` reads its checkpoint
from the provenance database and skips finished work; Prefect task results are
never cached or persisted (``NO_CACHE``), so the database is the only memory.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, cast

import httpx
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.flow_runs import suspend_flow_run
from prefect.states import Cancelled, Crashed

from flows._engine._approval import (
    ApprovalRequest,
    UnreadableAnswer,
    candidate_labels,
    describe,
)
from flows._engine._direct import code_version, open_store, record_ending, run_campaign
from flows._engine._failpoints import failpoint
from flows._engine._inputs import open_campaign
from flows._engine._notify import chain
from flows._engine._registration import Registration, judge_run
from flows._engine._round import CampaignResult, Hooks
from flows._paths import approvers_dir, campaign_dir, state_dir_from
from flows._prefect._approval_form import Approval, approval_form, forget_answers
from flows._prefect._artifacts import ui_observer
from flows._prefect._connect import ui_url
from flows._prefect._current_run import refuse_clone
from flows._prefect._endings import record_failure, state_for_ending
from flows._prefect._logging import install_log_filters
from flows._prefect._server import flow_run_ui_url
from flows._provenance import CampaignFenced, ProvenanceStore, SpecChanged
from flows._spec import load_campaign
from flows._telemetry import configure_telemetry
from policies import classify
from tasks import load_site

# code_version, open_store and run_campaign live in flows._engine._direct (no Prefect there) and
# are re-exported here for the callers that import them from this module.
__all__ = [
    "FLOW_NAME",
    "campaign_flow",
    "code_version",
    "final_state",
    "open_store",
    "run_campaign",
]

FLOW_NAME = "unattended-campaign"

# The flow-run process imports this module to find the flow: its log filters go in first.
install_log_filters()


async def _as_task(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run one step of a round as a Prefect task, so the UI shows the round's progress."""

    async def step() -> Any:
        return await fn()

    prefect_task = task(name=name, cache_policy=NO_CACHE, persist_result=False, retries=0)(step)
    return await prefect_task()


async def _suspend_for(request: ApprovalRequest, refused: int) -> Approval | UnreadableAnswer:
    """Suspend the flow run until an answer arrives on the request's form."""
    form = approval_form(
        batch_size=len(request.proposed),
        description=describe(request),
        allow_override=request.allow_override,
        require_code=request.require_proof,
        approvers=request.approvers,
        labels=candidate_labels(request),
    )
    try:
        # suspend_flow_run dispatches sync/async; awaited inside a coroutine it is async.
        answer = await suspend_flow_run(  # type: ignore[misc]
            wait_for_input=form, key=request.pause_key(refused)
        )
    except Exception as exc:  # Prefect's suspend signal is a BaseException
        if _is_outage(exc):
            # The server did not answer: nobody answered either. The run stops here,
            # nothing recorded, and the runner's watchdog continues it on the same request.
            raise RunInterrupted(request.pause_key(refused), type(exc).__name__) from exc
        # An input the form cannot read (planted through the API, or a run forced out of
        # its suspension): an answer like any other, judged (refused) and recorded, and
        # the run waits again; it never fails the campaign.
        get_run_logger().warning(
            "approval %s: the answer could not be read (%s); waiting again",
            request.pause_key(refused),
            type(exc).__name__,
        )
        return UnreadableAnswer(reason=type(exc).__name__)
    return cast(Approval, answer)


SERVER_UNAVAILABLE = "server_unavailable"


class RunInterrupted(BaseException):  # a signal, like Prefect's own Pause
    """The run cannot go on now and nothing was decided: it ends as crashed.

    Raised when the Prefect server cannot be reached while the run suspends for an
    approval or reads the answer. A ``BaseException``, like Prefect's suspend signal, so
    it passes the engine's ``except Exception`` untouched: no status, no ending and no
    answer are recorded. The flow returns *Crashed*; the runner's watchdog continues the
    campaign, whose new run waits on the same request (its notice was sent once).
    """

    def __init__(self, pause_key: str, cause: str) -> None:
        super().__init__(pause_key, cause)
        self.pause_key = pause_key
        self.cause = cause


def _is_outage(exc: BaseException) -> bool:
    """Return whether ``exc`` says the server could not be reached (not a bad answer)."""
    if isinstance(exc, httpx.TransportError | ConnectionError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500


class RunLog:
    """The run log's lines for the engine's events, in words, a few per round.

    A gate's outcome is said with the policy's decision on it (one line, not two);
    a simulation's result is not a line of its own (the batch's is).
    """

    def __init__(self) -> None:
        self._gate: Mapping[str, Any] | None = None

    def line(self, kind: str, data: Mapping[str, Any]) -> str | None:
        """Return the line for one event, or None when it is said with a later one."""
        at = f"round {data.get('round')}"
        match kind:
            case "task":
                return None
            case "gate":
                self._gate = data
                return None
            case "round":
                return f"{at} of {data.get('of')}: started"
            case "decision":
                gate, self._gate = self._gate, None
                policy = f"policy {data.get('outcome')}"
                if gate is None:
                    return f"{at}: {policy}"
                tries = gate.get("attempts")
                attempts = f"{tries} attempt{'' if tries == 1 else 's'}"
                return f"{at}: gate {gate.get('disposition')} after {attempts}; {policy}"
            case "batch":
                return f"{at}: batch finished, {data.get('done')} done, {data.get('failed')} failed"
            case "approval":
                return f"{at}: approval {data.get('verdict')} by {data.get('by')}"
            case "suspend":
                approvers = ", ".join(map(str, data.get("approvers") or ())) or "anyone allowed"
                return (
                    f"{at}: waiting for approval {data.get('key')} (rule {data.get('rule')}; "
                    f"approvers {approvers}; until {data.get('deadline')})"
                )
            case _:
                details = ", ".join(f"{key} {value}" for key, value in data.items())
                return f"{kind}: {details}" if details else kind


def _event_logger() -> Callable[[str, Any], None]:
    logger = get_run_logger()
    run_log = RunLog()

    def on_event(kind: str, data: Any) -> None:
        line = run_log.line(kind, data)
        if line is not None:
            logger.info("%s", line)

    return on_event


@flow(name=FLOW_NAME, persist_result=False, log_prints=False, validate_parameters=True)
async def campaign_flow(spec_path: str, site: str = "local", state_dir: str | None = None) -> Any:
    """Run (or continue) one campaign, as its owner registered it (never as the run says)."""
    refused = _refusal() or await refuse_clone()
    if refused is not None:
        return refused
    try:
        return await _campaign(spec_path, site, state_dir)
    except RunInterrupted as stop:
        get_run_logger().warning(
            "approval %s: the server could not be reached (%s); the run stops as crashed "
            "and the runner continues it on the same request",
            stop.pause_key,
            stop.cause,
        )
        return Crashed(
            message=f"interrupted ({SERVER_UNAVAILABLE}): {stop.cause} at {stop.pause_key}"
        )
    except Exception as exc:
        error = classify(exc)
        if error.code != "storage_unavailable":
            raise
        # A full disk or a read-only directory: the runner's watchdog continues it later
        # (the ending ``failed``/``storage_unavailable`` is recorded if the store took it).
        return state_for_ending("failed", error.code, error.message)


def _refusal() -> State[Any] | None:
    """Refuse a run that is not exactly what the owner of this state directory submitted.

    The run's parameters come from the server, where anyone holding the secret can
    write them; the state directory comes from this process (the runner's). Nothing
    the run names is loaded before this check: a refusal is recorded in the
    registered campaign's provenance (its own, trusted spec and site) and ends the
    run Failed with ``run_refused``.
    """
    context = FlowRunContext.get()
    flow_run = context.flow_run if context else None
    home = state_dir_from(None, os.environ)
    registration, refusal = judge_run(
        home,
        flow_run.deployment_id if flow_run else None,
        dict(flow_run.parameters) if flow_run else {},
    )
    if refusal is None:
        return None
    get_run_logger().error("run refused (%s): %s", refusal.code, refusal.message)
    if registration is not None:
        _record_refusal(registration, str(flow_run.id) if flow_run else None, refusal.fields)
    return state_for_ending("failed", refusal.code, refusal.message)


def _record_refusal(
    registration: Registration, flow_run_id: str | None, fields: tuple[str, ...]
) -> None:
    """Record a refused run in the registered campaign's provenance (best effort)."""
    try:
        loaded = load_campaign(registration.spec_path)
        site_config = load_site(registration.site, env=os.environ)
        store = open_store(site_config, loaded, Path(registration.state_dir))
    except Exception:  # noqa: BLE001  # the refusal stands; the log above says why
        get_run_logger().warning(
            "could not record the refusal in %s's provenance", registration.campaign
        )
        return
    try:
        store.record_event(
            registration.campaign,
            "run_refused",
            flow_run_id=flow_run_id,
            details={"fields": list(fields), "deployment_id": registration.deployment_id},
        )
        if flow_run_id is not None:
            store.record_run_ending(registration.campaign, flow_run_id, "failed", "run_refused")
    finally:
        store.close()


async def _campaign(spec_path: str, site: str, state_dir: str | None) -> Any:
    loaded = load_campaign(spec_path)
    site_config = load_site(site, env=os.environ)
    home = state_dir_from(state_dir, os.environ)
    directory = campaign_dir(home, loaded.spec.name)
    telemetry = configure_telemetry(
        directory / "telemetry.jsonl",
        campaign=loaded.spec.name,
        otlp_endpoint=site_config.otlp_endpoint,
    )
    store = open_store(site_config, loaded, home)
    context = FlowRunContext.get()
    flow_run_id = str(context.flow_run.id) if context and context.flow_run else None
    try:
        # Every run checks the pins, including one created by hand through the API.
        open_campaign(
            store, loaded, site_config, code_version=code_version(), flow_run_id=flow_run_id
        )
        result = await run_campaign(
            loaded,
            site_config,
            store,
            Hooks(
                step=_as_task,
                suspend=forget_answers(_suspend_for),
                flow_run_id=flow_run_id,
                on_event=chain(_event_logger(), ui_observer(loaded.spec.name, store, flow_run_id)),
            ),
            env=os.environ,
            work_dir=directory,
            approvers_dir=approvers_dir(home),
            run_link=lambda: (
                (flow_run_ui_url(ui_url(), flow_run_id), flow_run_id) if flow_run_id else None
            ),
        )
    except CampaignFenced as exc:
        # Another run holds the campaign: end at once, recorded, without touching it.
        _end(store, loaded.spec.name, flow_run_id, "failed", exc.code)
        return Cancelled(message=f"fenced out: {exc.message}")
    except SpecChanged as exc:
        _end(store, loaded.spec.name, flow_run_id, "failed", exc.code)
        return state_for_ending("failed", exc.code, exc.message)
    except Exception as exc:
        # A failure outside a round (the executor's start, say): the provenance says so.
        record_failure(store, loaded.spec.name, exc, flow_run_id)
        raise
    finally:
        telemetry.flush()
        store.close()
    failpoint("after_lease_released")  # the ending is recorded, the lease given back
    return final_state(result)


def _end(
    store: ProvenanceStore, name: str, flow_run_id: str | None, status: str, code: str
) -> None:
    """Record this run's ending, unless it has no id (a run outside a deployment)."""
    if flow_run_id is not None:
        record_ending(store, name, flow_run_id, status, code)


def final_state(result: CampaignResult) -> State[Any]:
    """Map how the campaign ended onto the flow run's state (the provenance holds the ending).

    ``run_campaign`` recorded the ending (``run_ending``) before it gave the lease back.
    """
    return state_for_ending(result.status, result.error_code, result.message)
