"""A gate call a failure stopped ends ``failed``: the ``gate_call.disposition`` choice.

A gate call ended by a failing producer or check (a planner that raised, a crashed
verifier) kept the disposition ``pending`` after its run failed, as if still
deciding. It now ends ``failed`` (a rerun of the campaign decides it again). The
upgrade gives that disposition to the pending calls whose attempts record a
failure (``attempt.failed_by``, revision 0009); the downgrade makes them pending.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels = None
depends_on = None

_OLD = ("pending", "accepted", "fallback", "not_accepted")
_NEW = (*_OLD, "failed")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _allow(values: tuple[str, ...]) -> None:
    """Make ``values`` the dispositions the CHECK constraint allows, keeping every attempt.

    Batch mode: SQLite cannot change a CHECK constraint in place, so the table is copied
    and the old one dropped; with foreign keys on (every connection of ours), dropping
    ``gate_call`` deletes its attempts (``ON DELETE CASCADE``), and the pragma cannot be
    turned off inside the migration's transaction. The attempts are kept aside and put
    back. PostgreSQL drops and adds the constraint in place.
    """
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("CREATE TEMP TABLE attempt_kept AS SELECT * FROM attempt")
    with op.batch_alter_table("gate_call") as batch:
        batch.drop_constraint("ck_gate_call_disposition", type_="check")
        batch.create_check_constraint("ck_gate_call_disposition", _in("disposition", values))
    if sqlite:
        op.execute("DELETE FROM attempt")  # none is left; said, not assumed
        op.execute("INSERT INTO attempt SELECT * FROM attempt_kept")
        op.execute("DROP TABLE attempt_kept")


def upgrade() -> None:
    _allow(_NEW)
    op.execute(
        "UPDATE gate_call SET disposition = 'failed' WHERE disposition = 'pending' AND EXISTS "
        "(SELECT 1 FROM attempt WHERE attempt.gate_call_id = gate_call.id "
        "AND attempt.failed_by IS NOT NULL)"
    )


def downgrade() -> None:
    op.execute("UPDATE gate_call SET disposition = 'pending' WHERE disposition = 'failed'")
    _allow(_OLD)
