"""How each flow run ended, in the flow's own words: the ``run_ending`` table.

A run's ending travelled as its Prefect state message (``campaign blocked
(policy_denied): ...``), which the runner's watchdog and the CLI parsed back. The
flow now records ``(status, code)`` per flow run, before it gives the campaign's
lease back; the watchdog, ``status`` and ``run`` read that row. Runs that ended
before this revision have none: their campaign's own status says how it ended.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_STATUSES = ("completed", "blocked", "escalated", "awaiting_approval", "failed")


def upgrade() -> None:
    op.create_table(
        "run_ending",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "campaign_id",
            sa.Integer(),
            sa.ForeignKey("campaign.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("flow_run_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("code", sa.String(), nullable=True),
        sa.Column("recorded_at", _TS, nullable=False),
        sa.UniqueConstraint("campaign_id", "flow_run_id", name="uq_run_ending"),
        sa.CheckConstraint(
            f"status IN ({', '.join(repr(s) for s in _STATUSES)})", name="ck_run_ending_status"
        ),
    )


def downgrade() -> None:
    op.drop_table("run_ending")
