"""What ``status`` and ``approvals`` show of campaign runs, and how to answer a waiting one.

These speak Prefect's REST API directly (``flows._prefect._rest``): importing Prefect's
client alone costs about a second. What a run's campaign recorded (its ending, its
lease) is read from its provenance with stdlib ``sqlite3`` (``read_record``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from flows._cli._runner import runner_alive
from flows._paths import state_dir_from
from flows._prefect._connect import connect, ui_url
from flows._prefect._server import flow_run_ui_url
from policies import ValidationFailed

if TYPE_CHECKING:
    from flows._prefect._pending import PendingApproval
    from flows._prefect._rest import RunView
    from flows._provenance import RunEnding
    from flows._provenance._sql import Reader

T = TypeVar("T")


def run_link(flow_run_id: object) -> str:
    """Return the run's page in the Prefect UI (the v2 UI, where Resume is)."""
    return flow_run_ui_url(ui_url(), flow_run_id)


def parse_run_id(text: str) -> UUID:
    """Return ``text`` as a flow run id; a bad one is refused naming the field ``run``."""
    try:
        return UUID(text)
    except ValueError:
        raise ValidationFailed(f"'{text}' is not a flow run id", details={"field": "run"}) from None


def pending_or_none(parameters: Mapping[str, Any], pause_key: str) -> PendingApproval | None:
    """Return what a waiting run asks for, or None when its provenance cannot tell."""
    from flows._prefect._pending import describe_pending

    try:
        return describe_pending(parameters, pause_key, os.environ)
    except Exception:  # noqa: BLE001  # the hint is best effort; the run state is what matters
        return None


def print_how_to_approve(flow_run_id: UUID, parameters: Mapping[str, Any], pause_key: str) -> None:
    """Print what a waiting run asks for and both ways to answer it (the UI, ``approve``)."""
    pending = pending_or_none(parameters, pause_key)
    print("  the campaign waits for approval")
    if pending is not None:
        print(f"  rule: {pending.rule}; approvers: {', '.join(pending.approvers) or '-'}")
        if pending.deadline:
            print(f"  answer by {pending.deadline.isoformat(timespec='seconds')}")
    print(f"  in the Prefect UI: {run_link(flow_run_id)}  (menu > Resume)")
    print(
        f"  or: unattended approve {flow_run_id} --as NAME [--reject] [--comment TEXT]", flush=True
    )


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
        print(f"{run.id}  {run.campaign:<24} {run.state_name:<12} {run_link(run.id)}")
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
    if not ours and registered(run) is None:
        return None
    if run.state_type == "RUNNING" and _holds_live_lease(run):
        return None  # the watchdog leaves it alone (orphan_reason); no Prefect to say so
    from flows._prefect._recovery_note import recovery_note_of

    return recovery_note_of(run.id, runner_alive=runner_alive()) or None


def read_record(run: Any, read: Callable[[Reader, str], T]) -> T | None:
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


def recorded_ending(run: Any) -> RunEnding | None:
    """Return how ``run`` ended as its flow recorded it (``run_ending``), None if unknown."""
    from flows._provenance._readers import run_endings

    endings = read_record(run, run_endings)
    return None if endings is None else endings.get(str(run.id))


def _holds_live_lease(run: RunView) -> bool:
    """Return whether ``run`` holds its campaign's lease, alive and unexpired.

    Such a run is never an orphan and nothing recovers it, so ``status`` has nothing to
    say of it: read from the provenance (``read_record``), this spares the Prefect
    client ``recovery_note_of`` needs (its import alone took 1.5 s, and each run a
    client and a store: ``status`` took 5.3 s with 24 campaigns running). Any doubt (no
    record, no registration, an unreadable database) says False: the watchdog's own
    rules judge the run then.
    """
    from flows._provenance._readers import lease

    held = read_record(run, lease)
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
        "ui_url": run_link(run.id),
        "recovery": recovery,
    }


def _approval_json(run: RunView, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Return what a waiting run asks for, and how to answer, as JSON (unknown fields null)."""
    pending = pending_or_none(parameters, run.pause_key)
    return {
        "flow_run_id": str(run.id),
        "campaign": pending.campaign if pending else run.campaign,
        "key": pending.key if pending else None,
        "rule": pending.rule if pending else None,
        "approvers": pending.approvers if pending else [],
        "requested_at": pending.requested_at if pending else None,
        "deadline": pending.deadline if pending else None,
        "on_timeout": pending.on_timeout if pending else None,
        "ui_url": run_link(run.id),
        "approve": f"unattended approve {run.id} --as NAME",
    }


def show_run(run: str, *, as_json: bool = False) -> int:
    """Show one run's state and, when it waits, how to approve it."""
    connect(start=False)
    from flows._prefect import _rest as rest

    found = rest.read_run(os.environ, parse_run_id(run))
    note = _recovery(found)
    queue = _queue_line(found) if found.state_type == "RUNNING" else ""
    parameters = registered(found)
    if as_json:
        document = _run_json(found, note)
        document["queue"] = queue or None
        document["ours"] = parameters is not None
        document["approval"] = (
            _approval_json(found, parameters) if parameters is not None and found.paused else None
        )
        print_json(document)
        return 0
    print(f"flow run {found.id} ({found.name}): {found.state_name}")
    if found.state_message:
        print(f"  {found.state_message}")
    if note:
        print(f"  {note}")
    print(f"  UI: {run_link(found.id)}")
    if queue:
        print(f"  {queue}")
    if parameters is None:
        print(
            f"  not a campaign of this state directory ({state_dir_from(None, os.environ)}): "
            "its runner and provenance are another user's (or it was made on the server by hand)"
        )
    elif found.paused:
        print_how_to_approve(found.id, parameters, found.pause_key)
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


def registered(run: Any) -> Mapping[str, Any] | None:
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
        print_how_to_approve(found.id, params, found.pause_key)
    return 0
