"""The provenance store: every attempt, verdict, decision, approval and result.

Importing this package does not import Prefect or the OpenTelemetry SDK, so
``unattended inspect`` works offline and starts fast; its names load on first use,
so the SQLite read path (``_sqlite``) does not import SQLAlchemy either.
"""

from typing import TYPE_CHECKING

import lazy_loader

if TYPE_CHECKING:
    from flows._provenance._errors import (
        CampaignFenced,
        DecisionMismatch,
        ProvenanceDatabaseError,
        SpecChanged,
        StorageUnavailable,
    )
    from flows._provenance._revisions import HEAD_REVISION
    from flows._provenance._rows import (
        ApprovalEventRecord,
        ApprovalRow,
        CandidateFateRecord,
        Checkpoint,
        GateCallEnd,
        LeaseRow,
        RunEnding,
        TaskResultRecord,
    )
    from flows._provenance._schema import CampaignStatus, EndingStatus
    from flows._provenance._store import ProvenanceStore

# Where each public name lives: loaded on first use (PEP 562), so the light read path
# (``_sqlite``) imports this package without SQLAlchemy.
__getattr__, __dir__, _ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_errors": [
            "CampaignFenced",
            "DecisionMismatch",
            "ProvenanceDatabaseError",
            "SpecChanged",
            "StorageUnavailable",
        ],
        "_revisions": ["HEAD_REVISION"],
        "_rows": [
            "ApprovalEventRecord",
            "ApprovalRow",
            "CandidateFateRecord",
            "Checkpoint",
            "GateCallEnd",
            "LeaseRow",
            "RunEnding",
            "TaskResultRecord",
        ],
        "_schema": ["CampaignStatus", "EndingStatus"],
        "_store": ["ProvenanceStore"],
    },
)


__all__ = [
    "HEAD_REVISION",
    "ApprovalEventRecord",
    "ApprovalRow",
    "CampaignFenced",
    "CampaignStatus",
    "CandidateFateRecord",
    "Checkpoint",
    "DecisionMismatch",
    "EndingStatus",
    "GateCallEnd",
    "LeaseRow",
    "ProvenanceDatabaseError",
    "ProvenanceStore",
    "RunEnding",
    "SpecChanged",
    "StorageUnavailable",
    "TaskResultRecord",
]
