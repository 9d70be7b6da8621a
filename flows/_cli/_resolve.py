"""Which flow run a command means: a run id as given, or a campaign name's current run.

Every command that takes a run (``status``, ``approve``) also takes the name of a
campaign submitted from this state directory; this one resolver turns the name
into the campaign's current run (the oldest that has not ended: the one that may wait
for answers, never a clone beside it), or with none going its newest run.
"""

from __future__ import annotations

import os
from datetime import datetime
from uuid import UUID

from flows._engine._registration import Registration


def registration_of(name: str) -> Registration:
    """Return campaign ``name``'s registration in this state directory.

    Raises:
        NotFound: no campaign of that name was submitted from this state directory.
    """
    from flows._engine._registration import require_registration
    from flows._paths import state_dir_from

    return require_registration(state_dir_from(None, os.environ), name)


def run_of(given: str) -> str:
    """Return the flow run id ``given`` means: itself, or campaign ``given``'s newest run.

    Raises:
        NotFound: ``given`` is neither a run id nor a campaign of this state directory,
            or the campaign has no flow run.
    """
    try:
        UUID(given)
    except ValueError:
        pass
    else:
        return given
    from flows._prefect._connect import connect
    from flows._prefect._current_run import current_run
    from flows._prefect._rest import request
    from policies import NotFound

    try:
        registration = registration_of(given)
    except NotFound as exc:
        raise NotFound(
            f"{given!r} is neither a flow run id nor a campaign submitted from this state "
            f"directory ({exc.details['state_dir']})",
            details={"campaign": given},
        ) from None
    connect(start=False)
    body = {
        "flow_runs": {"deployment_id": {"any_": [registration.deployment_id]}},
        "sort": "EXPECTED_START_TIME_DESC",
        "limit": 200,
        "offset": 0,
    }
    found = request(os.environ, "POST", "flow_runs/filter", body)
    if not found:
        raise NotFound(f"campaign {given!r} has no flow run", details={"campaign": given})
    # The campaign's current run (the one that may wait for answers) wins over a newer
    # clone refused beside it; with none going, the newest run (the one that ended last).
    current = current_run(
        (
            datetime.fromisoformat(run["created"]),
            str(run["id"]),
            (run.get("state") or {}).get("type") or "SCHEDULED",
        )
        for run in found
        if run.get("created")
    )
    return current or str(found[0]["id"])
