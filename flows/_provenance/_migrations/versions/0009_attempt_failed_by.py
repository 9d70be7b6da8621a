"""Record the attempt a failing check ended: ``attempt.failed_by``.

A verifier whose task crashed ends its attempt as a failure, not a rejection:
the attempt is recorded with ``failed_by`` naming the check (``rejected_by``
stays empty) and the check's verdict holding the task's status, exit code, job
and stderr tail.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: attempts recorded before revision 0009 never failed (a failing check's
    # attempt was not recorded at all).
    # Plain ADD COLUMN: a batch (table copy) of ``attempt`` is not needed to add one.
    op.add_column("attempt", sa.Column("failed_by", sa.String(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+).
    op.drop_column("attempt", "failed_by")
