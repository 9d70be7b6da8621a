"""Keep the rules a request was made under, and why an answer was refused.

``approval.require_proof`` and ``approval.allow_override`` are the request's
rules as they were when it was made: a later change of the campaign's inputs
(``submit --accept-changes``) applies from the next request on. An
``approval_event.refusal`` says why a refused answer was refused, when it was
not the approver (an override the rule does not allow, an unreadable input).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: requests and events recorded before revision 0008 carry none (replays of
    # such a request use the campaign's current rules, as before).
    # Plain ADD COLUMN: a batch (table copy) of ``approval`` would cascade to its events.
    op.add_column("approval", sa.Column("require_proof", sa.Boolean(), nullable=True))
    op.add_column("approval", sa.Column("allow_override", sa.Boolean(), nullable=True))
    op.add_column("approval_event", sa.Column("refusal", sa.String(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+): a batch copy of ``approval`` would cascade to its
    # events and delete them.
    op.drop_column("approval_event", "refusal")
    op.drop_column("approval", "allow_override")
    op.drop_column("approval", "require_proof")
