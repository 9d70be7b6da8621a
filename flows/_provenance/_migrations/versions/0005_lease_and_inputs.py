"""Add the campaign lease, the pinned inputs and the campaign's event log.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "campaign_lease",
        sa.Column(
            "campaign_id",
            sa.Integer(),
            sa.ForeignKey("campaign.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("token", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("acquired_at", _TS, nullable=False),
        sa.Column("heartbeat_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("released", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "input_pin",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "campaign_id",
            sa.Integer(),
            sa.ForeignKey("campaign.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("file", sa.Text(), nullable=True),
        sa.Column("sha256", sa.String(), nullable=False),
        sa.Column("recorded_at", _TS, nullable=False),
        sa.UniqueConstraint("campaign_id", "revision", "name", name="uq_input_pin"),
    )
    op.create_table(
        "campaign_event",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "campaign_id",
            sa.Integer(),
            sa.ForeignKey("campaign.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("flow_run_id", sa.String(), nullable=True),
        sa.Column("actor", sa.String(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.Column("recorded_at", _TS, nullable=False),
    )
    op.create_index("ix_campaign_event_campaign", "campaign_event", ["campaign_id", "kind"])


def downgrade() -> None:
    op.drop_index("ix_campaign_event_campaign", table_name="campaign_event")
    op.drop_table("campaign_event")
    op.drop_table("input_pin")
    op.drop_table("campaign_lease")
