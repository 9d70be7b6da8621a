"""What a suspended campaign run waits for, read from its parameters and the provenance.

Imports no Prefect and no round engine at module level, so ``unattended status``
and ``approvals`` stay fast: the run's parameters (spec, site, state directory)
and its pause key come from the flow run, everything else from the approval row.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flows._paths import campaign_dir, state_dir_from
from flows._spec import LoadedSpec, load_campaign
from tasks import load_site

if TYPE_CHECKING:
    from flows._provenance import ApprovalEventRecord, ApprovalRow


@dataclass(frozen=True)
class PendingApproval:
    """A suspended run's request: the rule, who may answer, and until when."""

    campaign: str
    key: str
    rule: str | None
    approvers: list[str]
    requested_at: datetime | None
    deadline: datetime | None
    pause_key: str = ""  # the form being answered: an answer's event carries this key
    on_timeout: str = "stop"
    # The run's parameters (spec, site, state directory): where its provenance is.
    parameters: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Whether the rule asks for a one-time code: the form then requires the field.
    require_proof: bool = False


def provenance_location(
    parameters: Mapping[str, Any], env: Mapping[str, str] | None
) -> tuple[LoadedSpec, Any]:
    """Return the run's spec and where its campaign's provenance database is (URL or folder)."""
    environment = os.environ if env is None else env
    # Its transcript and policy were checked and pinned at submission: the spec's own
    # fields name the site and the campaign, without loading the planners or CEL.
    loaded = load_campaign(parameters["spec_path"], named_files=False)
    site = load_site(parameters.get("site") or loaded.spec.site, env=environment)
    home = state_dir_from(parameters.get("state_dir"), environment)
    # The same database the flow writes (flows._engine._direct.open_store), opened read-only.
    location: Any = (
        site.provenance_url.get_secret_value()
        if site.provenance_url is not None
        else campaign_dir(home, loaded.spec.name)
    )
    return loaded, location


def _find_approval(
    parameters: Mapping[str, Any], key: str, env: Mapping[str, str] | None
) -> tuple[LoadedSpec, ApprovalRow | None]:
    """Return the run's spec and its approval ``key`` from the campaign's provenance."""
    from flows._provenance._sqlite import open_read_only

    loaded, location = provenance_location(parameters, env)
    with open_read_only(location) as store:
        return loaded, store.find_approval(key)


def describe_pending(
    parameters: Mapping[str, Any], pause_key: str, env: Mapping[str, str] | None = None
) -> PendingApproval:
    """Describe the request behind ``pause_key`` of a run started with ``parameters``."""
    key = pause_key.rsplit("-n", 1)[0]
    loaded, row = _find_approval(parameters, key, env)
    requested = row.requested_at if row else None
    if requested is not None and requested.tzinfo is None:
        requested = requested.replace(tzinfo=UTC)
    deadline = None
    if row is not None and requested is not None:
        # The flow computes its deadline with the same function from the same row
        # (flows._engine._approval: no planners, no pydantic).
        from flows._engine._approval import approval_deadline

        deadline = approval_deadline(requested, row.allocation_end, loaded.spec.approvals)
    return PendingApproval(
        loaded.spec.name,
        key,
        row.rule if row else None,
        list(row.approvers_allowed) if row else [],
        requested,
        deadline,
        pause_key,
        loaded.spec.approvals.on_timeout,
        dict(parameters),
        require_proof=bool(row.require_proof) if row else False,
    )


def answer_event(
    pending: PendingApproval, env: Mapping[str, str] | None = None
) -> ApprovalEventRecord | None:
    """Return the flow's verdict on the answer to ``pending``'s form, once it is recorded."""
    _, row = _find_approval(pending.parameters, pending.key, env)
    if row is None:
        return None
    return next((e for e in row.events if e.event_key == pending.pause_key), None)
