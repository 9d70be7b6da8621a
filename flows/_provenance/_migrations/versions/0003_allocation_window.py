"""Record the batch allocation's window on an approval request as typed columns.

Revision 0002 kept the allocation's end in the approval row's free-text
``description`` (``"allocation ends <iso>"``) and the flow and the watchdog
parsed it back. This revision adds ``allocation_start`` and ``allocation_end``
(timezone-aware), moves every such note into ``allocation_end`` and clears the
description it came from (the note was all it held). ``downgrade`` writes the
notes back.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels = None
depends_on = None

# The text revision 0002's code wrote; kept here so the migration never imports the app.
_NOTE = "allocation ends "

_approval = sa.table(
    "approval",
    sa.column("id", sa.Integer),
    sa.column("description", sa.Text),
    sa.column("allocation_end", sa.DateTime(timezone=True)),
)


def _parse(description: str) -> datetime | None:
    try:
        end = datetime.fromisoformat(description[len(_NOTE) :].strip())
    except ValueError:
        return None  # a note the old code could not read either: leave the row as it is
    return end if end.tzinfo else end.replace(tzinfo=UTC)


def upgrade() -> None:
    op.add_column("approval", sa.Column("allocation_start", sa.DateTime(timezone=True)))
    op.add_column("approval", sa.Column("allocation_end", sa.DateTime(timezone=True)))
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(_approval.c.id, _approval.c.description).where(
            _approval.c.description.like(_NOTE + "%")
        )
    ).all()
    for row in rows:
        end = _parse(row.description)
        if end is not None:
            connection.execute(
                _approval.update()
                .where(_approval.c.id == row.id)
                .values(allocation_end=end, description=None)
            )


def downgrade() -> None:
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(_approval.c.id, _approval.c.allocation_end).where(
            _approval.c.allocation_end.is_not(None), _approval.c.description.is_(None)
        )
    ).all()
    for row in rows:
        end = row.allocation_end if row.allocation_end.tzinfo else row.allocation_end.replace(
            tzinfo=UTC
        )
        connection.execute(
            _approval.update()
            .where(_approval.c.id == row.id)
            .values(description=_NOTE + end.astimezone(UTC).isoformat())
        )
    with op.batch_alter_table("approval") as batch:
        batch.drop_column("allocation_end")
        batch.drop_column("allocation_start")
