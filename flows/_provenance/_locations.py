"""Where a provenance database lives, and how a reader opens a SQLite file read-only.

Standard library only: ``unattended inspect`` resolves and opens a SQLite file
without importing SQLAlchemy (see ``flows/_provenance/_sqlite.py``).
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from flows._provenance._errors import ProvenanceDatabaseError

DB_FILENAME = "provenance.db"
DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")
SQLITE_HEADER = b"SQLite format 3\x00"
# Milliseconds a SQLite connection waits on a lock before SQLITE_BUSY.
BUSY_TIMEOUT_MS = 30_000
# What SQLite says when the file system, not another writer, refuses a write.
STORAGE_FAULTS = (
    "database or disk is full",
    "readonly database",
    "unable to open database file",
    "disk i/o error",
)


def is_storage_fault_message(message: str) -> bool:
    """Return whether a SQLite error message blames the disk or the directory."""
    lowered = message.lower()
    return any(fault in lowered for fault in STORAGE_FAULTS)


@dataclass(frozen=True)
class Location:
    """Where a provenance database lives: a SQLite file or a server URL."""

    url: str
    path: Path | None

    @property
    def label(self) -> str:
        """Return a printable name for messages (never a password)."""
        if self.path is not None:
            return str(self.path)
        from sqlalchemy.engine import make_url  # a server URL: SQLAlchemy is loaded anyway

        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def is_sqlite(self) -> bool:
        """Return True for a SQLite file."""
        return self.path is not None


def sqlite_location(path_text: str | os.PathLike[str]) -> Location:
    """Return the SQLite file a path names: a ``.db`` file, or ``<dir>/provenance.db``.

    A directory, or a path that does not exist yet and has no database suffix, is a
    campaign directory: the flow passes ``<state>/campaigns/<name>``.
    """
    path = Path(path_text).expanduser()
    if path.is_dir() or (not path.exists() and path.suffix not in DB_SUFFIXES):
        path = path / DB_FILENAME
    return Location(url="", path=path.absolute())


def check_sqlite_file(path: Path) -> None:
    """Raise :class:`ProvenanceDatabaseError` unless ``path`` is empty or a SQLite file."""
    try:
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise ProvenanceDatabaseError(
            f"cannot read provenance database {path}: {exc.strerror}",
            details={"path": str(path)},
        ) from None
    if header and header != SQLITE_HEADER:
        raise ProvenanceDatabaseError(
            f"{path} is not a SQLite database (corrupt or a different kind of file)",
            details={"path": str(path)},
        )


def read_only_uri(path: Path) -> str:
    """Return the ``file:`` URI that opens an existing SQLite file for reading only.

    Raises :class:`ProvenanceDatabaseError` for a missing file or one that is not SQLite.
    Without a write-ahead log no writer has the file open (the last one to close
    removes it), and opening it ``immutable`` creates no -wal/-shm beside it; with a
    log, a live run is writing and its -wal and -shm files are already there, so
    ``mode=ro`` reads the log too (what the writer committed so far).
    """
    if not path.is_file():
        raise ProvenanceDatabaseError(
            f"no provenance database at {path}", details={"path": str(path)}
        )
    check_sqlite_file(path)
    # URI filenames need percent-encoding ('?' or '#' in a directory name).
    live = Path(f"{path}-wal").exists()
    return f"file:{urllib.parse.quote(str(path))}?{'mode=ro' if live else 'immutable=1'}"
