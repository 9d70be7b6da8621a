"""Alembic migrations: the chain this code knows, upgrades, and newer schemas refused."""

from __future__ import annotations

from collections.abc import Iterator
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


class TestUpgrade:
    def test_the_migrated_schema_is_the_models_schema(self, empty_db: str) -> None:
        from alembic.autogenerate import compare_metadata
        from alembic.migration import MigrationContext

        with ProvenanceStore.open(empty_db) as store, store.engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), metadata) == []

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

    def test_reading_an_older_revision_is_refused_without_migrating(self, tmp_path: Path) -> None:
        _at(str(tmp_path / "p.db"), "0001")
        with pytest.raises(ProvenanceDatabaseError, match="older schema revision '0001'"):
            ProvenanceStore.open(tmp_path / "p.db", read_only=True)
        with ProvenanceStore.open(tmp_path / "p.db") as store, store.engine.connect() as c:
            assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0002"

    @pytest.mark.parametrize("read_only", [False, True])
    def test_a_newer_unknown_revision_is_refused(self, db_url: str, read_only: bool) -> None:
        with ProvenanceStore.open(db_url) as store:
            _stamp(store, "9999_future")
        with pytest.raises(ProvenanceDatabaseError, match="'9999_future'") as caught:
            ProvenanceStore.open(db_url, read_only=read_only)
        assert caught.value.code == "spec_invalid"
        assert caught.value.details["revision"] == "9999_future"
