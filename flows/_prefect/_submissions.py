"""Submit through the runner that is already up, instead of importing Prefect per command.

``unattended submit`` would spend a second or more importing Prefect to register
the deployment and create the run. The login node's runner has Prefect (and the
flow) imported already, so when it runs, the command validates the spec itself,
drops a request in ``<state dir>/submissions/`` and nudges the runner
(``flows._prefect._nudge``). The runner's watch loop takes the request (an atomic
rename, so one runner takes it once), submits exactly as the command would
(``submit_campaign``), writes the answer beside it and polls for the new run at
once. A runner that does not take the request in time (stopped, hung) is bypassed:
the request is withdrawn and the command submits by itself, as before.

Nothing here imports Prefect.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from flows._paths import private_dir, write_private
from flows._prefect._nudge import nudge_runner
from flows._spec import LoadedSpec
from policies import UnattendedError

_log = logging.getLogger(__name__)

SPOOL: Final = "submissions"
# How long a request may wait to be taken (the runner wakes within milliseconds when up).
TAKE_SECONDS: Final = 5.0
# How long a taken request may take to answer (registering a deployment, creating a run).
ANSWER_SECONDS: Final = 120.0
_POLL_SECONDS: Final = 0.02
# A submission slower than this to be taken, or to be answered, is logged by the runner.
_SLOW_SECONDS: Final = 1.0


@dataclass(frozen=True)
class Submitted:
    """A started (or already active) campaign run."""

    campaign: str
    flow_run_id: UUID
    deployment_id: UUID
    already_active: bool
    # Where the submission's time went, by step (seconds), for the runner's log.
    steps: Mapping[str, float] = field(default_factory=dict, compare=False)


Submit = Callable[..., Awaitable[Submitted]]


def validate_submission(
    spec_path: str | Path, site: str | None, env: Mapping[str, str]
) -> tuple[LoadedSpec, str]:
    """Check the campaign as ``unattended check`` does; return the spec and the site to run on.

    Raises:
        SpecInvalid, SiteInvalid: Listing every problem found (``flows._check``).
    """
    # Imported here: flows._check loads the planners and the engine (about 1 s of imports,
    # ``-X importtime``), which the rest of this module does not need.
    from flows._check import require_valid

    checked = require_valid(spec_path, site, env)
    return checked.loaded, checked.site_location


def spool_dir(state_dir: Path) -> Path:
    """Return the folder where requests and answers meet."""
    return state_dir / SPOOL


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    write_private(partial, json.dumps(data))  # the request names the user's spec: 0600
    os.replace(partial, path)


def submit_via_runner(
    spec: Path, site: str | None, state_dir: Path, runner_pid: int, *, accept_changes: bool = False
) -> Submitted | None:
    """Ask the runner ``runner_pid`` to submit; None if it did not take the request.

    Raises:
        UnattendedError: The runner took the request and the submission failed (the
            error it reported, with its code), or it did not answer in time.
    """
    folder = private_dir(spool_dir(state_dir))
    name = uuid.uuid4().hex
    request, answer = folder / f"{name}.request.json", folder / f"{name}.answer.json"
    _write_atomically(
        request,
        {
            "spec": str(spec.resolve()),
            "site": site,
            "state_dir": str(state_dir),
            "accept_changes": accept_changes,
        },
    )
    if not nudge_runner(runner_pid):
        request.unlink(missing_ok=True)
        return None
    take_by = time.monotonic() + TAKE_SECONDS
    answer_by: float | None = None
    while not answer.exists():
        moment = time.monotonic()
        if answer_by is None and moment > take_by:
            try:
                request.unlink()  # withdrawn: a runner renaming it now finds nothing
            except FileNotFoundError:
                answer_by = moment + ANSWER_SECONDS  # taken just now: wait for the answer
            else:
                return None
        elif answer_by is not None and moment > answer_by:
            raise UnattendedError(
                "the runner took the submission but did not answer; "
                "see 'unattended status' before submitting again",
                details={"request": name},
            )
        time.sleep(_POLL_SECONDS)
    data = json.loads(answer.read_text(encoding="utf-8"))
    answer.unlink()
    if "error" in data:
        raise UnattendedError(data["error"], code=data.get("code") or "internal")
    return Submitted(
        campaign=data["campaign"],
        flow_run_id=UUID(data["flow_run_id"]),
        deployment_id=UUID(data["deployment_id"]),
        already_active=bool(data["already_active"]),
    )


async def take_submissions(state_dir: Path, submit: Submit) -> int:
    """Answer every waiting request with ``submit(spec, site=, state_dir=, accept_changes=)``.

    Returns how many were answered.
    """
    folder = spool_dir(state_dir)
    if not folder.is_dir():
        return 0
    answered = 0
    for request in sorted(folder.glob("*.request.json")):
        name = request.name.removesuffix(".request.json")
        taken = folder / f"{name}.taken.json"
        try:
            os.rename(request, taken)  # atomic: the request is this runner's now
        except FileNotFoundError:
            continue  # withdrawn, or taken by another runner
        # The command wrote the request just before it nudged: how long the runner took to
        # come to it (a busy event loop shows here), then how long submitting took.
        waited = time.time() - taken.stat().st_mtime
        began = time.monotonic()
        data = json.loads(taken.read_text(encoding="utf-8"))
        result: dict[str, Any]
        steps: Mapping[str, float] = {}
        try:
            submitted = await submit(
                data["spec"],
                site=data["site"],
                state_dir=data["state_dir"],
                accept_changes=bool(data.get("accept_changes")),
            )
        except UnattendedError as exc:
            result = {"error": exc.message, "code": exc.code}
        except Exception as exc:  # noqa: BLE001  # reported to the command, the runner goes on
            result = {"error": f"submitting failed: {type(exc).__name__}", "code": "internal"}
        else:
            steps = submitted.steps
            result = {
                "campaign": submitted.campaign,
                "flow_run_id": str(submitted.flow_run_id),
                "deployment_id": str(submitted.deployment_id),
                "already_active": submitted.already_active,
            }
        _write_atomically(folder / f"{name}.answer.json", result)
        taken.unlink(missing_ok=True)
        took = time.monotonic() - began
        if waited > _SLOW_SECONDS or took > _SLOW_SECONDS:
            # Past the command's patience it submits by itself: worth the owner's eye.
            _log.warning(
                "runner: slow submission (%s): taken %.2f s after it was made, answered "
                "in %.2f s (%s)",
                result.get("campaign") or result.get("code"),
                waited,
                took,
                ", ".join(f"{step} {seconds:.2f} s" for step, seconds in steps.items()),
            )
        answered += 1
    return answered
