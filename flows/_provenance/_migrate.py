"""Bring a provenance database to the head schema revision, or refuse it.

Alembic runs in code (no ``alembic.ini``); the revisions live in
``flows/_migrations/versions`` inside the package. The upgrade runs in one
locking transaction (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on
PostgreSQL) so many processes opening a fresh database at once build it once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from sqlalchemy import Connection, Engine, inspect, text

from flows._provenance._engines import Location, begin_write
from flows._provenance._errors import ProvenanceDatabaseError

# Every revision this code knows, oldest first; a test pins this to Alembic's view.
KNOWN_REVISIONS: Final[tuple[str, ...]] = ("0001", "0002")
HEAD_REVISION: Final[str] = KNOWN_REVISIONS[-1]
MIGRATIONS_DIR: Final[Path] = Path(__file__).resolve().parent.parent / "_migrations"
# Arbitrary constant naming the PostgreSQL advisory lock held while migrating.
_PG_MIGRATION_LOCK: Final[int] = 0x756E_6174_7465


def current_revision(connection: Connection, location: Location) -> str | None:
    """Return the stamped revision, None for an empty database; refuse foreign ones."""
    tables = set(inspect(connection).get_table_names())
    if "alembic_version" not in tables:
        if tables:
            raise ProvenanceDatabaseError(
                f"{location.label} has tables but no provenance schema revision; "
                "it is not a provenance database",
                details={"location": location.label},
            )
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    if len(rows) != 1:
        raise ProvenanceDatabaseError(
            f"{location.label} has {len(rows)} schema revisions stamped; expected one",
            details={"location": location.label},
        )
    revision = str(rows[0][0])
    if revision not in KNOWN_REVISIONS:
        raise ProvenanceDatabaseError(
            f"{location.label} is at schema revision {revision!r}, which this version of "
            f"unattended does not know (it knows up to {HEAD_REVISION!r}); "
            "open it with a newer unattended",
            details={"location": location.label, "revision": revision, "head": HEAD_REVISION},
        )
    return revision


def check_readable(connection: Connection, location: Location) -> None:
    """Raise unless the database is at the head revision (read-only callers never migrate)."""
    revision = current_revision(connection, location)
    if revision is None:
        raise ProvenanceDatabaseError(
            f"{location.label} is empty: no campaign has been recorded in it",
            details={"location": location.label},
        )
    if revision != HEAD_REVISION:
        raise ProvenanceDatabaseError(
            f"{location.label} is at older schema revision {revision!r} (head is "
            f"{HEAD_REVISION!r}); open it for writing once (ProvenanceStore.open) to upgrade",
            details={"location": location.label, "revision": revision, "head": HEAD_REVISION},
        )


def upgrade(engine: Engine, location: Location, *, target: str = HEAD_REVISION) -> None:
    """Upgrade the database at ``engine`` to ``target`` (head by default)."""
    with begin_write(engine) as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        revision = current_revision(connection, location)
        if revision is not None and KNOWN_REVISIONS.index(revision) >= KNOWN_REVISIONS.index(
            target
        ):
            return
        # Imported here: Alembic costs import time that readers never need.
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = connection
        command.upgrade(config, target)
