"""Record batch allocations (Slurm jobs) and which one each task ran in (issue 13).

Adds the ``allocation`` table (one row per scheduler job that carried a
campaign's workers: requested, started, planned end, ended, end reason), the
task's ``job_id`` and its allocation's ``allocation_start``/``allocation_end`` on
``task_result``, the ``interrupted`` task status (the allocation ended before the
task finished), and ``batch.relaunch`` (0 for a round's batch, n for the n-th
relaunch of its interrupted candidates).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_OLD_STATUSES = ("done", "failed", "timeout", "cancelled")
_NEW_STATUSES = (*_OLD_STATUSES, "interrupted")
_END_REASONS = (
    "completed",
    "timeout",
    "cancelled",
    "node_fail",
    "preempted",
    "failed",
    "unknown",
    "released",
)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "allocation",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "campaign_id",
            sa.Integer(),
            sa.ForeignKey("campaign.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("request", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("node_count", sa.Integer(), nullable=False),
        sa.Column("requested_at", _TS, nullable=False),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("ends_at", _TS, nullable=True),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("end_reason", sa.String(), nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
        sa.UniqueConstraint("campaign_id", "job_id", name="uq_allocation_job"),
        sa.CheckConstraint(
            "end_reason IS NULL OR " + _in("end_reason", _END_REASONS),
            name="ck_allocation_end_reason",
        ),
    )
    op.create_index(
        "ix_allocation_campaign_request", "allocation", ["campaign_id", "request"], unique=False
    )
    with op.batch_alter_table("batch") as batch:
        batch.add_column(sa.Column("relaunch", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("task_result") as batch:
        batch.add_column(sa.Column("job_id", sa.String(), nullable=True))
        batch.add_column(sa.Column("allocation_start", _TS, nullable=True))
        batch.add_column(sa.Column("allocation_end", _TS, nullable=True))
        batch.drop_constraint("ck_task_result_status", type_="check")
        batch.create_check_constraint("ck_task_result_status", _in("status", _NEW_STATUSES))


def downgrade() -> None:
    op.execute("DELETE FROM task_result WHERE status = 'interrupted'")
    with op.batch_alter_table("task_result") as batch:
        batch.drop_constraint("ck_task_result_status", type_="check")
        batch.create_check_constraint("ck_task_result_status", _in("status", _OLD_STATUSES))
        batch.drop_column("allocation_end")
        batch.drop_column("allocation_start")
        batch.drop_column("job_id")
    with op.batch_alter_table("batch") as batch:
        batch.drop_column("relaunch")
    op.drop_index("ix_allocation_campaign_request", table_name="allocation")
    op.drop_table("allocation")
