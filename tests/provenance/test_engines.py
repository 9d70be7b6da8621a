"""Where the store keeps its data, how it opens it, and what it refuses to open."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from flows._provenance import ProvenanceDatabaseError, ProvenanceStore
from flows._provenance._engines import resolve


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


class TestResolve:
    def test_a_directory_means_its_provenance_db(self, tmp_path: Path) -> None:
        assert resolve(tmp_path).path == tmp_path / "provenance.db"

    def test_a_missing_path_without_a_suffix_is_a_campaign_directory(self, tmp_path: Path) -> None:
        assert (
            resolve(tmp_path / "campaigns" / "c1").path == tmp_path / "campaigns/c1/provenance.db"
        )

    def test_a_db_suffix_is_a_file(self, tmp_path: Path) -> None:
        assert resolve(tmp_path / "x.db").path == tmp_path / "x.db"

    def test_a_sqlite_url_is_its_file(self, tmp_path: Path) -> None:
        assert resolve(f"sqlite:///{tmp_path}/x.db").path == tmp_path / "x.db"

    def test_a_postgresql_url_gets_the_psycopg_driver(self) -> None:
        assert resolve("postgresql://u@127.0.0.1/db").url.startswith("postgresql+psycopg://")

    @pytest.mark.parametrize("url", ["sqlite://", "mysql://u@h/db"])
    def test_unusable_urls_are_refused(self, url: str) -> None:
        with pytest.raises(ProvenanceDatabaseError):
            resolve(url)

    def test_a_password_never_appears_in_the_label(self) -> None:
        assert "s3cret" not in resolve("postgresql+psycopg://u:s3cret@127.0.0.1/db").label


class TestSQLiteFile:
    def test_a_new_file_is_private_and_its_parents_are_created(self, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path / "a" / "b" / "p.db"):
            assert _mode(tmp_path / "a" / "b" / "p.db") == 0o600

    def test_the_write_ahead_log_is_private_too(self, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path) as store:
            store.ensure_campaign("c", spec={}, site="s", seed=1, code_version="v")
            assert _mode(tmp_path / "provenance.db-wal") == 0o600

    def test_wal_and_foreign_keys_are_on(self, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path) as store, store.engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1

    def test_an_empty_file_becomes_a_database(self, tmp_path: Path) -> None:
        (tmp_path / "p.db").touch()
        with ProvenanceStore.open(tmp_path / "p.db") as store:
            assert store.campaigns() == []

    def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(self, tmp_path: Path) -> None:
        path = tmp_path / "p.db"
        path.write_bytes(b"garbage, not a database" * 100)
        with pytest.raises(ProvenanceDatabaseError, match="not a SQLite database") as caught:
            ProvenanceStore.open(path)
        assert caught.value.code == "spec_invalid"
        assert path.read_bytes() == b"garbage, not a database" * 100

    def test_a_truncated_database_is_refused(self, tmp_path: Path, record_campaign: Any) -> None:
        with ProvenanceStore.open(tmp_path) as store:
            record_campaign(store, "demo", rounds=1)
        path = tmp_path / "provenance.db"
        path.write_bytes(path.read_bytes()[:5000])
        with pytest.raises(ProvenanceDatabaseError, match="malformed"):
            ProvenanceStore.open(path)

    def test_a_sqlite_database_of_another_program_is_refused(self, tmp_path: Path) -> None:
        import sqlite3

        with sqlite3.connect(tmp_path / "other.db") as connection:
            connection.execute("CREATE TABLE notes (body TEXT)")
        with pytest.raises(ProvenanceDatabaseError, match="not a provenance database"):
            ProvenanceStore.open(tmp_path / "other.db")


class TestReadOnly:
    def test_a_missing_database_is_refused_and_nothing_is_created(self, tmp_path: Path) -> None:
        with pytest.raises(ProvenanceDatabaseError, match="no provenance database"):
            ProvenanceStore.open(tmp_path / "campaigns" / "c", read_only=True)
        assert list(tmp_path.iterdir()) == []

    def test_an_empty_file_is_refused_and_left_empty(self, tmp_path: Path) -> None:
        (tmp_path / "p.db").touch()
        with pytest.raises(ProvenanceDatabaseError, match="is empty"):
            ProvenanceStore.open(tmp_path / "p.db", read_only=True)
        assert (tmp_path / "p.db").stat().st_size == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["p.db"]

    def test_reading_a_closed_database_creates_no_files(
        self, tmp_path: Path, record_campaign: Any
    ) -> None:
        with ProvenanceStore.open(tmp_path) as store:
            record_campaign(store, "demo", rounds=1)
        before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
        with ProvenanceStore.open(tmp_path, read_only=True) as store:
            assert store.summary("demo")["totals"]["rounds"] == 1
        assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before

    def test_reading_while_a_run_is_writing_sees_committed_rows(self, tmp_path: Path) -> None:
        with ProvenanceStore.open(tmp_path) as writer:
            writer.ensure_campaign("live", spec={}, site="s", seed=1, code_version="v")
            assert (tmp_path / "provenance.db-wal").exists()
            with ProvenanceStore.open(tmp_path, read_only=True) as reader:
                assert [c["name"] for c in reader.campaigns()] == ["live"]
                writer.start_round("live", 0)
                assert reader.load_checkpoint("live").rounds == {0: "running"}

    def test_a_read_only_store_cannot_write(self, tmp_path: Path) -> None:
        ProvenanceStore.open(tmp_path).close()
        with (
            ProvenanceStore.open(tmp_path, read_only=True) as store,
            pytest.raises(OperationalError, match="readonly"),
        ):
            store.ensure_campaign("c", spec={}, site="s", seed=1, code_version="v")
        with ProvenanceStore.open(tmp_path, read_only=True) as store:
            assert store.campaigns() == []

    def test_a_path_with_uri_characters_opens(self, tmp_path: Path) -> None:
        folder = tmp_path / "odd ?#% dir"
        ProvenanceStore.open(folder).close()
        with ProvenanceStore.open(folder, read_only=True) as store:
            assert store.campaigns() == []


def test_private_file_mode_survives_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        ProvenanceStore.open(tmp_path / "p.db").close()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "p.db") == 0o600
