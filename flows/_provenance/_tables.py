"""The head schema's tables as SQLAlchemy ``Table`` objects, for Core queries.

The report and the replay build a few Core queries of their own on these; the
inspect/export read model is SQL text (``_queries``) and does not use them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table

from flows._provenance._rows import as_dict
from flows._provenance._schema import (
    Approval,
    AttemptRow,
    Batch,
    Campaign,
    GateCall,
    PolicyDecision,
    Round,
    TaskResultRow,
    table,
)

CAMPAIGNS: Table = table(Campaign)
ROUNDS: Table = table(Round)
GATE_CALLS: Table = table(GateCall)
ATTEMPTS: Table = table(AttemptRow)
DECISIONS: Table = table(PolicyDecision)
APPROVALS: Table = table(Approval)
BATCHES: Table = table(Batch)
TASK_RESULTS: Table = table(TaskResultRow)


def plain_row(row: Any) -> dict[str, Any]:
    """Return a SQLAlchemy result row as a dict with datetimes as ISO text."""
    return {k: as_dict(v) for k, v in row._mapping.items()}
