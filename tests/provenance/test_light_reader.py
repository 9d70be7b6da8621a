"""The read model runs the same SQL on stdlib sqlite3 and on SQLAlchemy, with the same results.

``unattended inspect``/``export`` read a SQLite file through ``SqliteReadStore``
(no SQLAlchemy); the engine, reports and PostgreSQL read through the store's
connection. Both decode columns from ``_sql.COLUMNS``, pinned here to the schema.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, Boolean, DateTime

from flows._provenance import ProvenanceDatabaseError, ProvenanceStore
from flows._provenance._export import export_records
from flows._provenance._revisions import HEAD_REVISION
from flows._provenance._schema import metadata
from flows._provenance._sql import COLUMNS, KINDS, table_columns
from flows._provenance._sqlite import SqliteReadStore, open_read_only


def _kind(column: Any) -> str:
    if isinstance(column.type, JSON):
        return "json"
    if isinstance(column.type, DateTime):
        assert column.type.timezone, f"{column.table.name}.{column.name} is not timezone-aware"
        return "ts"
    if isinstance(column.type, Boolean):
        return "bool"
    return ""


def _everything(store: Any, name: str) -> dict[str, Any]:
    """Return every reader's answer for campaign ``name`` (JSON-ready)."""
    rounds = [r["index"] for r in store.summary(name)["rounds"]]
    with store.reading() as reader:
        records = list(export_records(reader, name))
    key = next(r["key"] for r in records if r["kind"] == "approval")
    approval = store.find_approval(key)
    return {
        "campaigns": store.campaigns(),
        "summary": store.summary(name),
        "rounds": [store.round_view(name, i) for i in rounds],
        "gate_calls": store.gate_calls(name, 0),
        "decisions": store.decisions(name, 0),
        "allocations": store.allocations(name),
        "export": records,
        "approval": approval,
        "approval_times": [approval.requested_at, *(e.recorded_at for e in approval.events)],
    }


class TestColumnMap:
    def test_the_map_is_the_schema_in_table_order_with_each_decoded_kind(self):
        schema = {t.name: [(c.name, _kind(c)) for c in t.columns] for t in metadata.sorted_tables}
        assert {t: table_columns(t) for t in COLUMNS} == schema

    def test_a_column_name_has_one_kind_in_every_table(self):
        assert KINDS["value"] == "json"
        assert KINDS["recorded_at"] == "ts"
        assert "key" not in KINDS


class TestDecoding:
    def test_every_column_decodes_as_sqlalchemy_s_own_types_do(self, tmp_path, record_campaign):
        """Each table read through SQLAlchemy Core (typed) equals the light reader's rows."""
        from sqlalchemy import select

        from flows._provenance._rows import utc
        from flows._provenance._sql import SqliteReader, columns

        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo", rounds=3)
            store.record_allocations(
                "demo",
                [
                    {
                        "job_id": "12",
                        "request": 1,
                        "state": "RUNNING",
                        "nodes": ["n1"],
                        "node_count": 1,
                        "requested_at": 1_700_000_000.25,
                        "started_at": 1_700_000_010.0,
                    }
                ],
            )
            typed = {}
            with store.engine.connect() as connection:
                for table in metadata.sorted_tables:
                    typed[table.name] = [
                        {k: utc(v) if hasattr(v, "tzinfo") else v for k, v in row._mapping.items()}
                        for row in connection.execute(select(table).order_by(*table.primary_key))
                    ]
        raw = sqlite3.connect(f"file:{tmp_path / 'c' / 'provenance.db'}?mode=ro", uri=True)
        reader = SqliteReader(raw)
        for table in metadata.sorted_tables:
            keys = ", ".join(c.name for c in table.primary_key)
            light = reader.all(f"SELECT {columns(table.name)} FROM {table.name} ORDER BY {keys}")
            assert light == typed[table.name], table.name
        assert typed["allocation"]
        assert typed["approval_event"]
        assert typed["task_result"]
        raw.close()

    def test_the_store_s_connection_decodes_as_typed_core_reads_on_each_backend(
        self, store, record_campaign
    ):
        """On SQLite and PostgreSQL, the SQL text through SQLAlchemy equals typed Core reads."""
        from sqlalchemy import select

        from flows._provenance._rows import utc
        from flows._provenance._sql import columns

        record_campaign(store, "demo", rounds=2)
        with store.engine.connect() as connection:
            typed = {
                table.name: [
                    {k: utc(v) if hasattr(v, "tzinfo") else v for k, v in row._mapping.items()}
                    for row in connection.execute(select(table).order_by(*table.primary_key))
                ]
                for table in metadata.sorted_tables
            }
        with store.reading() as reader:
            for table in metadata.sorted_tables:
                keys = ", ".join(c.name for c in table.primary_key)
                query = f"SELECT {columns(table.name)} FROM {table.name} ORDER BY {keys}"
                assert reader.all(query) == typed[table.name], table.name
        assert typed["attempt"]


class TestSameAnswers:
    def test_the_light_reader_answers_as_the_store_does(self, tmp_path, record_campaign):
        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo", rounds=3)
            full = _everything(store, "demo")
        with open_read_only(tmp_path / "c") as light:
            assert isinstance(light, SqliteReadStore)
            assert _everything(light, "demo") == full
            assert light.location.label == str(tmp_path / "c" / "provenance.db")

    def test_the_lease_reads_as_the_store_s_own(self, tmp_path, record_campaign):
        from flows._provenance._readers import lease

        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo", rounds=1)
            assert store.acquire_lease("demo", "run-1", ttl=60).acquired
            held = store.lease("demo")
            with open_read_only(tmp_path / "c") as light, light.reading() as reader:
                assert lease(reader, "demo") == held
                assert lease(reader, "ghost") is None
            store.release_lease("demo")
            released = store.lease("demo")
            with open_read_only(tmp_path / "c") as light, light.reading() as reader:
                assert lease(reader, "demo") == released
        assert held is not None
        assert not held.expired()
        assert released is not None
        assert released.expired()

    def test_datetimes_come_back_aware_utc_with_the_same_text(self, tmp_path, record_campaign):
        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo")
        with open_read_only(tmp_path / "c") as light:
            summary = light.summary("demo")
            approval = light.find_approval(summary["approvals"][0]["key"])
        assert approval is not None
        assert approval.requested_at.utcoffset() is not None
        assert approval.requested_at.utcoffset().total_seconds() == 0
        assert summary["campaign"]["created_at"].endswith("+00:00")
        # The text is what the writer stored, read back as UTC.
        raw = (
            sqlite3.connect(tmp_path / "c" / "provenance.db")
            .execute("SELECT created_at FROM campaign")
            .fetchone()[0]
        )
        assert summary["campaign"]["created_at"] == raw.replace(" ", "T") + "+00:00"

    def test_an_unknown_campaign_is_not_found_on_both(self, tmp_path, record_campaign):
        from policies import NotFound

        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo")
        with open_read_only(tmp_path / "c") as light, pytest.raises(NotFound, match="'other'"):
            light.summary("other")


class TestRefusals:
    def _message(self, opener: Any, where: Path) -> str:
        with pytest.raises(ProvenanceDatabaseError) as caught:
            opener(where)
        return caught.value.message

    def _both(self, where: Path) -> tuple[str, str]:
        light = self._message(open_read_only, where)
        full = self._message(lambda p: ProvenanceStore.open(p, read_only=True), where)
        return light, full

    def test_a_newer_revision_is_refused_with_the_store_s_error(self, tmp_path):
        ProvenanceStore.open(tmp_path / "c").close()
        db = tmp_path / "c" / "provenance.db"
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE alembic_version SET version_num = '9999'")
        light, full = self._both(db)
        assert light == full
        assert "'9999'" in light
        assert HEAD_REVISION in light

    def test_an_older_revision_an_empty_file_and_a_foreign_one_are_refused_alike(self, tmp_path):
        ProvenanceStore.open(tmp_path / "c").close()
        db = tmp_path / "c" / "provenance.db"
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE alembic_version SET version_num = '0001'")
        assert len(set(self._both(db))) == 1
        empty = tmp_path / "empty.db"
        sqlite3.connect(empty).close()
        assert len(set(self._both(empty))) == 1
        foreign = tmp_path / "foreign.db"
        with sqlite3.connect(foreign) as raw:
            raw.execute("CREATE TABLE t (x)")
        light, full = self._both(foreign)
        assert light == full
        assert "not a provenance database" in light
        text = tmp_path / "notes.db"
        text.write_text("hello, not a database at all")
        assert len(set(self._both(text))) == 1
        assert len(set(self._both(tmp_path / "missing.db"))) == 1

    def test_a_corrupt_file_is_refused_with_the_store_s_error(self, tmp_path, record_campaign):
        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo")
        db = tmp_path / "c" / "provenance.db"
        data = bytearray(db.read_bytes())
        data[100:4096] = b"\xff" * (4096 - 100)  # the first page's b-tree: sqlite_master
        db.write_bytes(bytes(data))
        light, full = self._both(db)
        assert light == full


class TestLiveAndFinished:
    def test_a_finished_campaign_is_read_without_creating_files(self, tmp_path, record_campaign):
        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo")
        before = sorted(p.name for p in (tmp_path / "c").iterdir())
        assert before == ["provenance.db"]
        with open_read_only(tmp_path / "c") as light:
            assert light.summary("demo")["totals"]["rounds"] == 2
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == before

    def test_a_live_writer_s_committed_rounds_are_seen_through_its_log(
        self, tmp_path, record_campaign
    ):
        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo")
            store.start_round("demo", 2)  # committed, in the write-ahead log
            assert (tmp_path / "c" / "provenance.db-wal").exists()
            with open_read_only(tmp_path / "c") as light:
                assert [r["status"] for r in light.summary("demo")["rounds"]] == [
                    "completed",
                    "completed",
                    "running",
                ]
                store.checkpoint_round(
                    "demo",
                    2,
                    surrogate_state=None,
                    policy_state=None,
                    planner_state=None,
                    status="completed",
                )
                # Each read is its own snapshot: the next one sees the new commit.
                assert light.summary("demo")["rounds"][2]["status"] == "completed"

    def test_a_live_campaign_is_read_by_another_process(self, tmp_path, record_campaign):
        with ProvenanceStore.open(tmp_path / "c") as store:
            record_campaign(store, "demo")
            store.start_round("demo", 2)
            code = (
                "import json, sys; from flows._provenance._sqlite import open_read_only; "
                f"s = open_read_only({str(tmp_path / 'c')!r}); "
                "print(json.dumps([len(s.summary('demo')['rounds']), "
                "sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'sqlmodel'))]))"
            )
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
            )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [3, []]
