"""Prefect flows, approvals, the provenance store, settings and the ``unattended`` CLI.

Importing ``flows`` is cheap: every name below is loaded on first use, so
``unattended inspect`` never imports Prefect, and the campaign engine
(``CampaignEngine``) can be driven without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lazy_loader

if TYPE_CHECKING:
    from flows._engine._approval import ApprovalRequest, judge
    from flows._engine._round import CampaignEngine, CampaignResult, Hooks
    from flows._prefect._approval_form import Approval, approval_form
    from flows._prefect._campaign import campaign_flow, run_campaign
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._server import (
        ServerConfig,
        ServerHandle,
        load_server_config,
        start_server,
        stop_server,
    )
    from flows._prefect._service import CampaignService, approve_run, expire_approvals
    from flows._prefect._submissions import Submitted
    from flows._provenance import (
        ApprovalEventRecord,
        ApprovalRow,
        Checkpoint,
        ProvenanceDatabaseError,
        ProvenanceStore,
        TaskResultRecord,
    )
    from flows._spec import CampaignSpec, LoadedSpec, load_campaign, spec_from_dict
    from flows._telemetry import configure_telemetry

__getattr__, __dir__, _ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_engine._approval": ["ApprovalRequest", "judge"],
        "_engine._round": ["CampaignEngine", "CampaignResult", "Hooks"],
        "_prefect._approval_form": ["Approval", "approval_form"],
        "_prefect._campaign": ["campaign_flow", "run_campaign"],
        "_prefect._deployment": ["submit_campaign"],
        "_prefect._server": [
            "ServerConfig",
            "ServerHandle",
            "load_server_config",
            "start_server",
            "stop_server",
        ],
        "_prefect._service": ["CampaignService", "approve_run", "expire_approvals"],
        "_prefect._submissions": ["Submitted"],
        "_provenance": [
            "ApprovalEventRecord",
            "ApprovalRow",
            "Checkpoint",
            "ProvenanceDatabaseError",
            "ProvenanceStore",
            "TaskResultRecord",
        ],
        "_spec": ["CampaignSpec", "LoadedSpec", "load_campaign", "spec_from_dict"],
        "_telemetry": ["configure_telemetry"],
    },
)


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
