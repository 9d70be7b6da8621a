"""Remove one campaign's provenance rows, in one transaction (``unattended delete --purge``).

Every table of the head schema is covered: a table with a ``campaign_id`` column
loses that campaign's rows, a table reached through a parent (``attempt`` through
``gate_call``, ``approval_event`` through ``approval``, ``task_result`` through
``batch``) loses the rows of that campaign's parents, and ``campaign`` its row.
Children go before their parents (the schema's dependency order, reversed), so the
deletes never lean on ``ON DELETE CASCADE`` and behave the same on SQLite and
PostgreSQL. A table this module does not know how to reach raises before anything
is deleted: a new table must say how it belongs to a campaign.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from sqlalchemy import Connection, Table, delete, select

from flows._provenance._schema import provenance_tables
from flows._provenance._writes import campaign_id, in_transaction

if TYPE_CHECKING:
    from flows._provenance._store import ProvenanceStore

# Tables without a campaign_id column: (their column naming the parent, the parent table).
THROUGH_PARENT: Final = {
    "attempt": ("gate_call_id", "gate_call"),
    "approval_event": ("approval_id", "approval"),
    "task_result": ("batch_id", "batch"),
}


def purge_plan() -> list[Table]:
    """Return the schema's tables in the order their rows are deleted (children first).

    Raises:
        AssertionError: A table is neither keyed by ``campaign_id`` nor reached
            through a known parent (a schema change this module must follow).
    """
    tables = list(reversed(provenance_tables().sorted_tables))
    for found in tables:
        known = "campaign_id" in found.c or found.name in THROUGH_PARENT or found.name == "campaign"
        if not known:
            raise AssertionError(f"purge does not know how table {found.name} holds a campaign")
    return tables


def purge_campaign(store: ProvenanceStore, name: str) -> int:
    """Delete every row of campaign ``name`` in one transaction; return how many (0: unknown).

    The caller makes sure no run of the campaign is active: a run that still wrote
    would find its campaign gone.
    """
    tables = purge_plan()
    by_name = {t.name: t for t in tables}

    def work(connection: Connection) -> int:
        cid = campaign_id(connection, name)
        if cid is None:
            return 0
        removed = 0
        for found in tables:
            if found.name == "campaign":
                statement = delete(found).where(found.c.id == cid)
            elif "campaign_id" in found.c:
                statement = delete(found).where(found.c.campaign_id == cid)
            else:
                column, parent_name = THROUGH_PARENT[found.name]
                parent = by_name[parent_name]
                parents = select(parent.c.id).where(parent.c.campaign_id == cid)
                statement = delete(found).where(found.c[column].in_(parents))
            removed += connection.execute(statement).rowcount or 0
        return removed

    return in_transaction(store.engine, work)
