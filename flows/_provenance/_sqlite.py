"""Read a SQLite provenance database with the standard library only.

``unattended inspect``, ``export``, ``status <id>`` and ``approvals`` read the
record without importing SQLAlchemy (about half a second of imports): the file is
opened read-only with stdlib ``sqlite3`` (``immutable`` when no run writes it,
``mode=ro`` beside a live run's write-ahead log), its schema revision is checked
as :meth:`ProvenanceStore.open` checks it (same errors), and the same queries run
(``_readers``, ``_queries``). A URL (PostgreSQL) opens the full store instead.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator

from flows._provenance._errors import ProvenanceDatabaseError, StorageUnavailable
from flows._provenance._locations import (
    BUSY_TIMEOUT_MS,
    Location,
    is_storage_fault_message,
    read_only_uri,
    sqlite_location,
)
from flows._provenance._readers import StoreReads
from flows._provenance._revisions import STAMP_SQL, require_head, stamped_revision
from flows._provenance._sql import SqliteReader

# The table names SQLAlchemy's inspector reports on SQLite (SQLite's own ones left out).
_TABLES_SQL = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite~_%' ESCAPE '~'"
)


class SqliteReadStore(StoreReads):
    """A read-only SQLite provenance database: the store's readers, without SQLAlchemy."""

    def __init__(
        self, connection: sqlite3.Connection, location: Location, *, snapshot: bool = False
    ) -> None:
        self.connection = connection
        self.location = location
        # Opened ``immutable`` (no writer had it open): what it reads never changes, so a
        # reader following a live campaign opens it again to see later writes.
        self.snapshot = snapshot

    @classmethod
    def open(cls, location: Location) -> SqliteReadStore:
        """Open the file read-only; refuse a missing, foreign, empty, older or newer database."""
        assert location.path is not None
        uri = read_only_uri(location.path)
        try:
            connection = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise _refused(exc, location) from None
        try:
            connection.execute("PRAGMA query_only = ON")
            tables = [row[0] for row in connection.execute(_TABLES_SQL)]
            revision = stamped_revision(
                tables,
                lambda: [str(row[0]) for row in connection.execute(STAMP_SQL)],
                location.label,
            )
            require_head(revision, location.label)
        except sqlite3.Error as exc:
            connection.close()
            raise _refused(exc, location) from None
        except BaseException:
            connection.close()
            raise
        return cls(connection, location, snapshot="immutable=1" in uri)

    @contextlib.contextmanager
    def reading(self) -> Iterator[SqliteReader]:
        """Yield a reader inside one read transaction (one snapshot of a live run's record)."""
        self.connection.execute("BEGIN")
        try:
            yield SqliteReader(self.connection)
        finally:
            self.connection.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()


def _refused(exc: sqlite3.Error, location: Location) -> Exception:
    """Return the error :meth:`ProvenanceStore.open` raises for the same SQLite failure."""
    message = str(exc).strip()
    if isinstance(exc, sqlite3.OperationalError) and is_storage_fault_message(message):
        return StorageUnavailable(
            f"cannot write provenance database {location.label}: the disk is full "
            "or the directory is read-only",
            details={"path": location.label},
        )
    reason = message.splitlines()[0] if message else ""
    return ProvenanceDatabaseError(
        f"cannot use provenance database {location.label}: {reason or 'unreadable'}",
        details={"path": location.label},
    )


def open_read_only(url_or_path: str | os.PathLike[str]) -> StoreReads:
    """Open the provenance at a path, directory or URL for reading only.

    A SQLite file (a path, a campaign directory) gets :class:`SqliteReadStore`; a
    URL gets ``ProvenanceStore.open(..., read_only=True)``. Both have the same
    read methods, ``close`` and ``location``, and refuse the same databases.
    """
    text = os.fspath(url_or_path)
    if "://" in text:
        from flows._provenance._store import ProvenanceStore

        return ProvenanceStore.open(text, read_only=True)
    return SqliteReadStore.open(sqlite_location(text))
