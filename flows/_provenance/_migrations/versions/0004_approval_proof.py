"""Record how an approver proved who they are on each approval event (never the code).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: events recorded before proofs existed had none.
    with op.batch_alter_table("approval_event") as batch:
        batch.add_column(sa.Column("proof", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("approval_event") as batch:
        batch.drop_column("proof")
