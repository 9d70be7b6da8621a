"""Record what became of each candidate: launched, refused by a rule, struck, skipped.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A new table only: rounds recorded before it simply have no candidate fates.
    op.create_table(
        "candidate_fate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("call_index", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("candidate_index", sa.Integer(), nullable=False),
        sa.Column("candidate", sa.JSON(), nullable=True),
        sa.Column("fate", sa.String(), nullable=False),
        sa.Column("rule", sa.String(), nullable=True),
        sa.Column("actor", sa.String(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "fate IN ('launched', 'refused', 'struck', 'skipped')", name="ck_candidate_fate"
        ),
        sa.CheckConstraint("source IN ('proposal', 'fallback')", name="ck_candidate_fate_source"),
        sa.ForeignKeyConstraint(
            ["campaign_id", "round_index"],
            ["round.campaign_id", "round.round_index"],
            name="fk_candidate_fate_round",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "campaign_id",
            "round_index",
            "call_index",
            "source",
            "candidate_index",
            name="uq_candidate_fate",
        ),
    )


def downgrade() -> None:
    op.drop_table("candidate_fate")
