"""The provenance store: every attempt, verdict, decision, approval and result.

Importing this package does not import Prefect or the OpenTelemetry SDK, so
``unattended inspect`` works offline and starts fast.
"""

from flows._provenance._errors import ProvenanceDatabaseError
from flows._provenance._migrate import HEAD_REVISION
from flows._provenance._rows import (
    ApprovalEventRecord,
    ApprovalRow,
    Checkpoint,
    TaskResultRecord,
)
from flows._provenance._store import ProvenanceStore

__all__ = [
    "HEAD_REVISION",
    "ApprovalEventRecord",
    "ApprovalRow",
    "Checkpoint",
    "ProvenanceDatabaseError",
    "ProvenanceStore",
    "TaskResultRecord",
]
