"""Prefect flows, approvals, the provenance store, settings and the ``unattended`` CLI.

Importing ``flows`` is cheap: every name below is loaded on first use, so
``unattended inspect`` never imports Prefect, and the campaign engine
(``CampaignEngine``) can be driven without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flows._approval import ApprovalRequest, judge
    from flows._approval_form import Approval, approval_form
    from flows._campaign import campaign_flow, run_campaign
    from flows._provenance import (
        ApprovalEventRecord,
        ApprovalRow,
        Checkpoint,
        ProvenanceDatabaseError,
        ProvenanceStore,
        TaskResultRecord,
    )
    from flows._round import CampaignEngine, CampaignResult, Hooks
    from flows._server import (
        ServerConfig,
        ServerHandle,
        load_server_config,
        start_server,
        stop_server,
    )
    from flows._service import (
        CampaignService,
        Submitted,
        approve_run,
        expire_approvals,
        submit_campaign,
    )
    from flows._spec import CampaignSpec, LoadedSpec, load_campaign, spec_from_dict
    from flows._telemetry import configure_telemetry

_LAZY: dict[str, str] = {
    "Approval": "flows._approval_form",
    "ApprovalEventRecord": "flows._provenance",
    "ApprovalRequest": "flows._approval",
    "ApprovalRow": "flows._provenance",
    "CampaignEngine": "flows._round",
    "CampaignResult": "flows._round",
    "CampaignService": "flows._service",
    "CampaignSpec": "flows._spec",
    "Checkpoint": "flows._provenance",
    "Hooks": "flows._round",
    "LoadedSpec": "flows._spec",
    "ProvenanceDatabaseError": "flows._provenance",
    "ProvenanceStore": "flows._provenance",
    "ServerConfig": "flows._server",
    "ServerHandle": "flows._server",
    "Submitted": "flows._service",
    "TaskResultRecord": "flows._provenance",
    "approval_form": "flows._approval_form",
    "approve_run": "flows._service",
    "campaign_flow": "flows._campaign",
    "configure_telemetry": "flows._telemetry",
    "expire_approvals": "flows._service",
    "judge": "flows._approval",
    "load_campaign": "flows._spec",
    "load_server_config": "flows._server",
    "run_campaign": "flows._campaign",
    "spec_from_dict": "flows._spec",
    "start_server": "flows._server",
    "stop_server": "flows._server",
    "submit_campaign": "flows._service",
}


def __getattr__(name: str) -> Any:
    """Import a lazily exported name on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flows' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Approval",
    "ApprovalEventRecord",
    "ApprovalRequest",
    "ApprovalRow",
    "CampaignEngine",
    "CampaignResult",
    "CampaignService",
    "CampaignSpec",
    "Checkpoint",
    "Hooks",
    "LoadedSpec",
    "ProvenanceDatabaseError",
    "ProvenanceStore",
    "ServerConfig",
    "ServerHandle",
    "Submitted",
    "TaskResultRecord",
    "approval_form",
    "approve_run",
    "campaign_flow",
    "configure_telemetry",
    "expire_approvals",
    "judge",
    "load_campaign",
    "load_server_config",
    "run_campaign",
    "spec_from_dict",
    "start_server",
    "stop_server",
    "submit_campaign",
]
