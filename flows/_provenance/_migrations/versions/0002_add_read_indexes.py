"""Add the indexes ``unattended inspect`` reads through.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels = None
depends_on = None

_INDEXES: tuple[tuple[str, str, list[str]], ...] = (
    ("ix_round_campaign_status", "round", ["campaign_id", "status"]),
    ("ix_gate_call_campaign_disposition", "gate_call", ["campaign_id", "disposition"]),
    ("ix_policy_decision_campaign", "policy_decision", ["campaign_id", "outcome"]),
    ("ix_approval_campaign_round", "approval", ["campaign_id", "round_index"]),
    ("ix_approval_event_approval", "approval_event", ["approval_id"]),
    ("ix_batch_campaign_round", "batch", ["campaign_id", "round_index"]),
    ("ix_task_result_batch_objective", "task_result", ["batch_id", "objective"]),
)


def upgrade() -> None:
    for name, table, columns in _INDEXES:
        op.create_index(name, table, columns, unique=False)


def downgrade() -> None:
    for name, table, _columns in reversed(_INDEXES):
        op.drop_index(name, table_name=table)
