"""``purge_campaign`` (``unattended delete --purge``) removes one campaign's rows, on each backend.

A database shared by several campaigns (a site's PostgreSQL ``provenance_url``) keeps
every row of the others: the database is back to exactly what it held before the
purged campaign was recorded.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from flows._provenance import CandidateFateRecord
from flows._provenance._purge import THROUGH_PARENT, purge_campaign, purge_plan
from flows._provenance._schema import provenance_tables


def row_counts(store: Any) -> dict[str, int]:
    """Return how many rows each table of the schema holds."""
    with store.engine.connect() as connection:
        return {
            t.name: int(connection.execute(select(func.count()).select_from(t)).scalar_one())
            for t in provenance_tables().sorted_tables
        }


def record_more(store: Any, name: str) -> None:
    """Add what ``fill_campaign`` leaves out: events, a lease, input pins, candidate fates."""
    store.record_event(name, "deleted", actor="ana", details={"why": "test"})
    store.acquire_lease(name, "run-1", ttl=60.0)
    store.pin_inputs(name, 1, {"policy": ("policy.toml", "ab" * 32)})
    store.record_candidate_fates(
        name,
        0,
        0,
        [CandidateFateRecord("proposal", 0, [0.25], "launched", reason="ran")],
    )


class TestPurgeCampaign:
    def test_purging_one_campaign_leaves_the_database_as_it_was_before_it(
        self, store: Any, record_campaign: Any
    ) -> None:
        record_campaign(store, "kept")
        record_more(store, "kept")
        before = row_counts(store)
        record_campaign(store, "purged")
        record_more(store, "purged")
        filled = row_counts(store)
        added = sum(filled.values()) - sum(before.values())
        assert added > 0

        removed = purge_campaign(store, "purged")

        assert row_counts(store) == before
        assert removed == added
        assert [c["name"] for c in store.campaigns()] == ["kept"]
        assert store.summary("kept")["campaign"]["name"] == "kept"

    def test_an_unknown_campaign_removes_nothing(self, store: Any, record_campaign: Any) -> None:
        record_campaign(store, "kept")
        before = row_counts(store)

        assert purge_campaign(store, "no-such-campaign") == 0

        assert row_counts(store) == before

    def test_every_table_of_the_schema_is_reached(self) -> None:
        names = {t.name for t in purge_plan()}
        assert names == {t.name for t in provenance_tables().sorted_tables}
        assert set(THROUGH_PARENT) <= names
        # Children are deleted before their parents.
        order = [t.name for t in purge_plan()]
        for child, (_column, parent) in THROUGH_PARENT.items():
            assert order.index(child) < order.index(parent)
        assert order[-1] == "campaign"
