"""Alembic migrations: the chain this code knows, upgrades, and newer schemas refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, text

from flows._provenance import HEAD_REVISION, ProvenanceDatabaseError, ProvenanceStore
from flows._provenance._engines import open_engine, resolve
from flows._provenance._migrate import KNOWN_REVISIONS, MIGRATIONS_DIR, upgrade
from flows._provenance._schema import metadata


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Return an empty database (no schema at all) on each backend."""
    if request.param == "sqlite":
        yield str(tmp_path / "p.db")
        return
    request.getfixturevalue("pg_template")  # skips without a server
    create_pg_database = request.getfixturevalue("pg_admin")["create"]
    drop_pg_database = request.getfixturevalue("pg_admin")["drop"]

    name = create_pg_database()
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        drop_pg_database(name)


def _at(url: str, revision: str) -> None:
    location = resolve(url)
    engine = open_engine(location, read_only=False)
    try:
        upgrade(engine, location, target=revision)
    finally:
        engine.dispose()


def _downgrade(store: Any, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from flows._provenance._migrate import MIGRATIONS_DIR

    with store.engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def _stamp(store: Any, revision: str) -> None:
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})


class TestRevisions:
    def test_the_known_chain_is_alembics_chain(self) -> None:
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        script = ScriptDirectory.from_config(config)
        chain = [r.revision for r in script.walk_revisions("base", "heads")]
        assert tuple(reversed(chain)) == KNOWN_REVISIONS
        assert script.get_heads() == [HEAD_REVISION]


def _replayed(url: str) -> None:
    """Bring an empty database to the head by replaying every revision."""
    location = resolve(url)
    engine = open_engine(location, read_only=False)
    try:
        upgrade(engine, location, from_models=False)
    finally:
        engine.dispose()


def _schema_of(url: str) -> dict[str, Any]:
    """Return every table's columns, keys, indexes and constraints, as the database reports them."""
    location = resolve(url)
    engine = open_engine(location, read_only=True)
    try:
        with engine.connect() as connection:
            seen = inspect(connection)
            described: dict[str, Any] = {}
            for name in sorted(seen.get_table_names()):
                described[name] = {
                    "columns": sorted(
                        (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                        for c in seen.get_columns(name)
                    ),
                    "primary key": seen.get_pk_constraint(name)["constrained_columns"],
                    "foreign keys": sorted(
                        (
                            tuple(f["constrained_columns"]),
                            f["referred_table"],
                            tuple(f["referred_columns"]),
                            str(f.get("options")),
                        )
                        for f in seen.get_foreign_keys(name)
                    ),
                    "indexes": sorted(
                        (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                        for i in seen.get_indexes(name)
                    ),
                    "unique": sorted(
                        (u["name"], tuple(u["column_names"]))
                        for u in seen.get_unique_constraints(name)
                    ),
                    "checks": sorted(
                        (c["name"], " ".join(c["sqltext"].split()))
                        for c in seen.get_check_constraints(name)
                    ),
                }
            described["alembic_version"]["rows"] = connection.execute(
                text("SELECT version_num FROM alembic_version")
            ).all()
            return described
    finally:
        engine.dispose()


class TestUpgrade:
    def test_the_migrated_schema_is_the_models_schema(self, empty_db: str) -> None:
        from alembic.autogenerate import compare_metadata
        from alembic.migration import MigrationContext

        _replayed(empty_db)
        with ProvenanceStore.open(empty_db) as store, store.engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), metadata) == []

    def test_a_new_database_built_from_the_models_equals_the_replayed_revisions(
        self, empty_db: str, tmp_path: Path, request: pytest.FixtureRequest
    ) -> None:
        """A fresh database is created from the models and stamped: the same schema, to the
        column, key, index and CHECK constraint, as replaying every revision gives."""
        if empty_db.startswith("postgresql"):
            replayed = request.getfixturevalue("pg_admin")["create"]()
            replayed_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{replayed}"
        else:
            replayed_url = str(tmp_path / "replayed.db")
        try:
            ProvenanceStore.open(empty_db).close()  # the new-database path
            _replayed(replayed_url)
            built, migrated = _schema_of(empty_db), _schema_of(replayed_url)
            assert built["alembic_version"]["rows"] == [(HEAD_REVISION,)]
            assert set(built) == set(migrated)
            for name in built:
                assert built[name] == migrated[name], name
        finally:
            if empty_db.startswith("postgresql"):
                request.getfixturevalue("pg_admin")["drop"](replayed)

    def test_a_first_revision_database_is_upgraded_with_its_data(self, empty_db: str) -> None:
        _at(empty_db, "0001")
        with ProvenanceStore.open(empty_db) as store:
            store.ensure_campaign("old", spec={}, site="s", seed=1, code_version="v")
        with ProvenanceStore.open(empty_db) as store, store.engine.connect() as connection:
            assert (
                connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
                == HEAD_REVISION
            )
            indexes = {ix["name"] for ix in inspect(connection).get_indexes("task_result")}
            assert "ix_task_result_batch_objective" in indexes
            assert [c["name"] for c in store.campaigns()] == ["old"]

    def test_a_0002_allocation_note_becomes_the_allocation_end_column(self, empty_db: str) -> None:
        """Revision 0003 moves "allocation ends <iso>" out of the description into a column."""
        _at(empty_db, "0002")
        moment = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
        end = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)
        location = resolve(empty_db)
        engine = open_engine(location, read_only=False)
        try:
            with engine.begin() as c:
                c.execute(
                    text(
                        "INSERT INTO campaign (id, name, spec, site, seed, code_version, status,"
                        " created_at, updated_at) VALUES (1, 'old', '{}', 's', 1, 'v',"
                        " 'awaiting_approval', :t, :t)"
                    ),
                    {"t": moment},
                )
                c.execute(
                    text(
                        "INSERT INTO round (campaign_id, round_index, status, started_at)"
                        " VALUES (1, 0, 'running', :t)"
                    ),
                    {"t": moment},
                )
                for key, description in (
                    ("old-r0-c1", "allocation ends " + end.isoformat()),
                    ("old-r0-c2", "a note a human wrote"),
                    ("old-r0-c3", None),
                ):
                    c.execute(
                        text(
                            "INSERT INTO approval (campaign_id, round_index, key,"
                            " approvers_allowed, requested_at, description)"
                            " VALUES (1, 0, :k, '[]', :t, :d)"
                        ),
                        {"k": key, "t": moment, "d": description},
                    )
        finally:
            engine.dispose()
        with ProvenanceStore.open(empty_db) as store:
            noted, human, plain = (store.find_approval(f"old-r0-c{n}") for n in (1, 2, 3))
        assert None not in (noted, human, plain)
        assert (noted.allocation_end, noted.description) == (end, None)
        assert (human.allocation_end, human.description) == (None, "a note a human wrote")
        assert (plain.allocation_end, plain.allocation_start) == (None, None)

    def test_reading_an_older_revision_is_refused_without_migrating(self, tmp_path: Path) -> None:
        _at(str(tmp_path / "p.db"), "0001")
        with pytest.raises(ProvenanceDatabaseError, match="older schema revision '0001'"):
            ProvenanceStore.open(tmp_path / "p.db", read_only=True)
        with ProvenanceStore.open(tmp_path / "p.db") as store, store.engine.connect() as c:
            assert (
                c.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD_REVISION
            )

    def test_0007_keeps_task_results_and_allows_interrupted_and_allocations(
        self, empty_db: str
    ) -> None:
        _at(empty_db, "0006")
        location = resolve(empty_db)
        engine = open_engine(location, read_only=False)
        now = "2026-12-01 10:00:00"
        with engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO campaign (id, name, spec, site, seed, code_version, status, "
                    "created_at, updated_at) VALUES (1, 'c', '{}', 's', 1, 'v', 'running', "
                    ":t, :t)"
                ),
                {"t": now},
            )
            c.execute(
                text(
                    "INSERT INTO round (id, campaign_id, round_index, status, started_at) "
                    "VALUES (1, 1, 0, 'running', :t)"
                ),
                {"t": now},
            )
            c.execute(
                text(
                    "INSERT INTO batch (id, key, campaign_id, round_index, candidates, backend, "
                    "launched_at, status) VALUES (1, 'k', 1, 0, '[]', 'dask', :t, 'finished')"
                ),
                {"t": now},
            )
            c.execute(
                text(
                    "INSERT INTO task_result (batch_id, task_index, key, status, attempts) "
                    "VALUES (1, 0, 'k/0', 'done', 1)"
                )
            )
        engine.dispose()
        _at(empty_db, "0007")
        engine = open_engine(location, read_only=False)
        try:
            with engine.begin() as c:
                row = c.execute(text("SELECT status, job_id FROM task_result")).one()
                assert tuple(row) == ("done", None)
                assert c.execute(text("SELECT relaunch FROM batch")).scalar() == 0
                c.execute(
                    text(
                        "INSERT INTO task_result (batch_id, task_index, key, status, attempts, "
                        "job_id) VALUES (1, 1, 'k/1', 'interrupted', 1, '12')"
                    )
                )
                c.execute(
                    text(
                        "INSERT INTO allocation (campaign_id, job_id, request, state, nodes, "
                        "node_count, requested_at, updated_at, end_reason) VALUES "
                        "(1, '12', 1, 'TIMEOUT', '[]', 1, :t, :t, 'timeout')"
                    ),
                    {"t": now},
                )
        finally:
            engine.dispose()

    def test_a_0003_database_keeps_its_approval_events_and_gains_their_proof(
        self, empty_db: str
    ) -> None:
        """Revision 0004: ``approval_event.proof``, None on the events recorded before it."""
        with ProvenanceStore.open(empty_db) as store:
            store.ensure_campaign("old", spec={}, site="s", seed=1, code_version="v")
            store.start_round("old", 2)
            store.record_approval_request(
                "old", 2, key="k", rule="r", approvers=["a"], description=None, flow_run_id=None
            )
            store.record_approval_event("k", decided_by="a", decision="approved", allowed=True)
            _downgrade(store, "0003")
        with ProvenanceStore.open(empty_db) as store:
            row = store.find_approval("k")
            assert row is not None
            assert [(e.decided_by, e.decision, e.proof) for e in row.events] == [
                ("a", "approved", None)
            ]
            store.record_approval_event(
                "k", decided_by="a", decision="approved", allowed=True, proof="totp ok"
            )
            row = store.find_approval("k")
            assert row is not None
            assert row.events[-1].proof == "totp ok"

    def test_a_0004_database_gains_the_lease_and_the_pins(self, empty_db: str) -> None:
        _at(empty_db, "0004")
        with ProvenanceStore.open(empty_db) as store:
            store.ensure_campaign("old", spec={}, site="s", seed=1, code_version="v")
        _at(empty_db, "0004")  # already further: a no-op
        with ProvenanceStore.open(empty_db) as store:
            assert store.acquire_lease("old", "run-1", ttl=30).acquired
            store.pin_inputs("old", 1, {"spec": ("campaign.toml", "ab" * 32)})
            store.record_event("old", "inputs_pinned", details={"revision": 1})
            assert store.pinned_inputs("old") == (1, {"spec": ("campaign.toml", "ab" * 32)})
            assert [e["kind"] for e in store.events("old")] == ["inputs_pinned"]
            assert [c["name"] for c in store.campaigns()] == ["old"]

    def test_a_0005_database_keeps_its_rounds_and_gains_candidate_fates(
        self, empty_db: str
    ) -> None:
        """Revision 0006: the ``candidate_fate`` table, empty for the rounds before it."""
        from flows._provenance import CandidateFateRecord

        with ProvenanceStore.open(empty_db) as store:
            store.ensure_campaign("old", spec={}, site="s", seed=1, code_version="v")
            store.start_round("old", 0)
            store.record_decision("old", 0, 1, {"outcome": "continue"})
            _downgrade(store, "0005")
            assert "candidate_fate" not in inspect(store.engine).get_table_names()
        with ProvenanceStore.open(empty_db) as store:
            assert [d["outcome"] for d in store.decisions("old", 0)] == ["continue"]
            assert store.round_view("old", 0)["candidates"] == []
            refused = CandidateFateRecord("proposal", 1, [0.5, 0.5], "refused", rule="r")
            store.record_candidate_fates("old", 0, 1, [refused])
            launched = CandidateFateRecord("proposal", 1, [0.5, 0.5], "launched")
            store.record_candidate_fates("old", 0, 1, [launched])  # the first fate stands
            fates = store.round_view("old", 0)["candidates"]
            assert [(f["candidate_index"], f["fate"], f["rule"]) for f in fates] == [
                (1, "refused", "r")
            ]

    @pytest.mark.parametrize("read_only", [False, True])
    def test_a_newer_unknown_revision_is_refused(self, db_url: str, read_only: bool) -> None:
        with ProvenanceStore.open(db_url) as store:
            _stamp(store, "9999_future")
        with pytest.raises(ProvenanceDatabaseError, match="'9999_future'") as caught:
            ProvenanceStore.open(db_url, read_only=read_only)
        assert caught.value.code == "spec_invalid"
        assert caught.value.details["revision"] == "9999_future"
