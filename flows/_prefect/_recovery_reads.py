"""What the watchdog's recovery plan is given, read the same way by the runner and ``status``.

The plan (``flows._prefect._recovery_plan``) decides with no I/O; this module does the
reading it needs. Of Prefect and this host: each run as the plan sees it
(``seen_run``), with whether a process of the runner executes it
(``flow_runs_alive_here``). Of the campaign's provenance (``campaign_store`` opens it
by the registration): its ``Record`` (``read_record``), the continuations in a row
without progress (``continuations``) and the cap the runner last counted against
(``recorded_cap``). The watchdog (``flows._prefect._recovery``) acts on the plan;
``flows._prefect._recovery_note`` describes it.
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from typing import Any

import psutil
from prefect.client.schemas.objects import FlowRun

from flows._engine._direct import open_store
from flows._engine._registration import registration_for
from flows._paths import state_dir_from
from flows._prefect._endings import CANCEL_REQUESTED, SHUTDOWN_MESSAGE
from flows._prefect._recovery_plan import (
    EXHAUSTED_CODE,
    MAX_CONTINUATIONS,
    Continuations,
    Record,
    SeenLease,
    SeenRun,
)
from flows._prefect._warm_start import flow_runs_started_here
from flows._provenance import ProvenanceStore
from flows._spec import load_campaign
from tasks import load_site

__all__ = [
    "campaign_store",
    "continuations",
    "flow_runs_alive_here",
    "read_record",
    "recorded_cap",
    "seen_run",
]


def flow_runs_alive_here(root: int | None = None) -> set[str]:
    """Return the ids of the flow runs that a process's descendants are executing.

    Prefect's runner starts each flow run as a child process with
    ``PREFECT__FLOW_RUN_ID`` in its environment; a run found here is alive, whatever
    its lease says (it may still be starting, on a machine that is slow today).
    ``root`` is the runner's pid (default: this process, the runner's own watchdog,
    which also counts the runs it forked from its forkserver: their environment is set
    after the fork, where /proc does not show it); an unknown or gone pid has no
    descendants.
    """
    alive: set[str] = flow_runs_started_here() if root is None else set()
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return alive
    for child in children:
        with contextlib.suppress(psutil.Error):
            run_id = child.environ().get("PREFECT__FLOW_RUN_ID")
            if run_id:
                alive.add(run_id)
    return alive


def _aware(moment: datetime | None, default: datetime) -> datetime:
    if moment is None:
        return default
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def seen_run(
    flow_run: FlowRun,
    registered: dict[str, Any] | None,
    alive: frozenset[str] | set[str],
    now: datetime,
) -> SeenRun:
    """Return what the plan sees of a Prefect flow run (``registered``: the owner's parameters).

    The one place a Prefect state message is read: Prefect's runner marks the runs it
    cancels as it shuts down with its own words (``SHUTDOWN_MESSAGE``), and nothing else.
    """
    state = flow_run.state
    kind = state.type.value if state is not None else "UNKNOWN"
    return SeenRun(
        id=str(flow_run.id),
        state=kind,
        since=_aware(state.timestamp if state is not None else None, now),
        created=_aware(flow_run.created, now),
        ours=registered is None or dict(flow_run.parameters) == registered,
        alive_here=str(flow_run.id) in alive,
        shutdown=kind == "CANCELLED" and (state.message if state else None) == SHUTDOWN_MESSAGE,
    )


def _progress_mark(store: ProvenanceStore, name: str) -> tuple[int, int]:
    progress = store.progress(name)
    return progress.rounds, progress.tasks


def continuations(store: ProvenanceStore, name: str, cap: int = MAX_CONTINUATIONS) -> Continuations:
    """Count campaign ``name``'s continuations in a row without progress (``Continuations``).

    ``cap`` is the setting ``max_continuations``: how many make the campaign stop.
    """
    progress = _progress_mark(store, name)
    count, last_at = 0, None
    for event in store.events(name):
        if event["kind"] == EXHAUSTED_CODE:
            count, last_at = 0, None
        elif event["kind"] == "continued":
            details = event["details"] or {}
            if details.get("counted") and details.get("progress") == list(progress):
                count += 1
                last_at = _aware(event["recorded_at"], datetime.now(UTC))
    return Continuations(count=count, last_at=last_at, progress=progress, cap=cap)


def recorded_cap(store: ProvenanceStore, name: str) -> tuple[int | None, int | None]:
    """Return (the cap the runner last counted against, continuations when it stopped).

    Read from the newest ``continued`` and ``continuations_exhausted`` events: the cap
    is the runner's setting, which another process (``status``) need not share.
    """
    cap = stopped_after = None
    for event in store.events(name):
        details = event["details"] or {}
        if event["kind"] == "continued" and details.get("cap") is not None:
            cap = int(details["cap"])
        elif event["kind"] == EXHAUSTED_CODE:
            stopped_after = details.get("continuations")
            cap = int(details.get("cap", cap or MAX_CONTINUATIONS))
    return cap, stopped_after


def read_record(store: ProvenanceStore, name: str, tally: Continuations) -> Record:
    """Read what the recovery plan needs of campaign ``name``'s provenance (``Record``)."""
    status, code = _status(store, name)
    lease = store.lease(name)
    seen_lease = (
        None
        if lease is None
        else SeenLease(
            owner=lease.owner,
            pid=lease.pid,
            released=lease.released,
            expires_at=_aware(lease.expires_at, datetime.now(UTC)),
            holder_gone=not lease.released and lease.holder_gone(),
        )
    )
    asked = frozenset(
        str(e["flow_run_id"]) for e in store.events(name, kind=CANCEL_REQUESTED) if e["flow_run_id"]
    )
    return Record(
        status=status,
        code=code,
        lease=seen_lease,
        endings=store.run_endings(name),
        cancel_asked=asked,
        tally=tally,
    )


def campaign_store(flow_run_or_params: FlowRun | dict[str, Any]) -> tuple[str, ProvenanceStore]:
    """Open the provenance store of a campaign run (by its registration) or of parameters.

    A flow run is looked up by its deployment among this state directory's
    registrations, never by the parameters it carries (``KeyError`` when it is not
    one of ours); parameters are taken as given (the caller read them from one).
    """
    if isinstance(flow_run_or_params, FlowRun):
        registration = registration_for(
            state_dir_from(None, os.environ), flow_run_or_params.deployment_id
        )
        if registration is None:
            raise KeyError(str(flow_run_or_params.deployment_id))
        params = registration.parameters
    else:
        params = flow_run_or_params
    loaded = load_campaign(params["spec_path"])
    site = load_site(params.get("site") or loaded.spec.site, env=os.environ)
    home = state_dir_from(params.get("state_dir"), os.environ)
    return loaded.spec.name, open_store(site, loaded, home)


def _status(store: ProvenanceStore, name: str) -> tuple[str | None, str | None]:
    found = next((c for c in store.campaigns() if c["name"] == name), None)
    return (found["status"], found["error_code"]) if found else (None, None)
