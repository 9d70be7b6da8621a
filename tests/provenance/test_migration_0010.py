"""Revision 0010: a gate call a failure stopped ends ``failed`` (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from flows._provenance._engines import open_engine, resolve
from flows._provenance._migrate import upgrade


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Return an empty database (no schema at all) on each backend."""
    if request.param == "sqlite":
        yield str(tmp_path / "p.db")
        return
    request.getfixturevalue("pg_template")  # skips without a server
    admin = request.getfixturevalue("pg_admin")
    name = admin["create"]()
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        admin["drop"](name)


def _migrate(url: str, revision: str) -> None:
    location = resolve(url)
    engine = open_engine(location, read_only=False)
    try:
        upgrade(engine, location, target=revision)
    finally:
        engine.dispose()


def _downgrade(url: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from flows._provenance._migrate import MIGRATIONS_DIR

    engine = open_engine(resolve(url), read_only=False)
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR))
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        engine.dispose()


_NOW = "2026-12-03 10:00:00"


def _two_pending_calls(url: str) -> None:
    """Record at 0009 a call a crashed verifier stopped (call 0) and one still deciding (1)."""
    engine = open_engine(resolve(url), read_only=False)
    try:
        with engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO campaign (id, name, spec, site, seed, code_version, status, "
                    "created_at, updated_at) VALUES (1, 'c', '{}', 's', 1, 'v', 'failed', :t, :t)"
                ),
                {"t": _NOW},
            )
            c.execute(
                text(
                    "INSERT INTO round (id, campaign_id, round_index, status, started_at) "
                    "VALUES (1, 1, 0, 'failed', :t)"
                ),
                {"t": _NOW},
            )
            for call in (0, 1):
                c.execute(
                    text(
                        "INSERT INTO gate_call (id, campaign_id, round_index, call_index, name, "
                        "budget, attempts_used, disposition, fallback_computed_at) "
                        "VALUES (:id, 1, 0, :call, 'planner', 2, 1, 'pending', :t)"
                    ),
                    {"id": call + 1, "call": call, "t": _NOW},
                )
            c.execute(
                text(
                    "INSERT INTO attempt (gate_call_id, number, value, failed_by, reason, scores, "
                    "verdicts, duration) VALUES (1, 1, 'null', 'verifier', 'crashed', '{}', "
                    "'[]', 0.1)"
                )
            )
    finally:
        engine.dispose()


def _dispositions(url: str) -> list[tuple[int, str]]:
    """Return each gate call's disposition; first check its attempt is still there.

    SQLite copies the table to change its CHECK constraint: dropping the old one would
    delete the attempts (ON DELETE CASCADE) unless the migration keeps them.
    """
    engine = open_engine(resolve(url), read_only=True)
    try:
        with engine.connect() as c:
            kept = c.execute(text("SELECT gate_call_id, number, failed_by FROM attempt"))
            assert [tuple(row) for row in kept] == [(1, 1, "verifier")]
            found = c.execute(text("SELECT id, disposition FROM gate_call ORDER BY id"))
            return [(int(i), str(d)) for i, d in found]
    finally:
        engine.dispose()


def test_0010_ends_the_calls_a_failure_stopped_failed_and_allows_the_disposition(
    empty_db: str,
) -> None:
    _migrate(empty_db, "0009")
    _two_pending_calls(empty_db)

    _migrate(empty_db, "0010")

    assert _dispositions(empty_db) == [(1, "failed"), (2, "pending")]
    engine = open_engine(resolve(empty_db), read_only=False)
    try:
        with engine.begin() as c:
            c.execute(text("UPDATE gate_call SET disposition = 'failed' WHERE id = 2"))
        with pytest.raises(IntegrityError), engine.begin() as c:
            c.execute(text("UPDATE gate_call SET disposition = 'crashed' WHERE id = 2"))
    finally:
        engine.dispose()


def test_0010_downgraded_makes_failed_calls_pending_again(empty_db: str) -> None:
    _migrate(empty_db, "0009")
    _two_pending_calls(empty_db)
    _migrate(empty_db, "0010")

    _downgrade(empty_db, "0009")

    assert _dispositions(empty_db) == [(1, "pending"), (2, "pending")]
    engine = open_engine(resolve(empty_db), read_only=False)
    try:
        with pytest.raises(IntegrityError), engine.begin() as c:
            c.execute(text("UPDATE gate_call SET disposition = 'failed' WHERE id = 1"))
    finally:
        engine.dispose()
