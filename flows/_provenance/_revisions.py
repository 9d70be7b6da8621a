"""Which schema revisions this code knows, and the verdict on a database's stamp.

Standard library only, so the SQLite read path checks the revision without
importing Alembic or SQLAlchemy; ``_migrate`` asks the same questions through
SQLAlchemy before it upgrades.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from flows._provenance._errors import ProvenanceDatabaseError

# Every revision this code knows, oldest first; a test pins this to Alembic's view.
KNOWN_REVISIONS: Final[tuple[str, ...]] = (
    "0001",
    "0002",
    "0003",
    "0004",
    "0005",
    "0006",
    "0007",
    "0008",
    "0009",
    "0010",
    "0011",
)
HEAD_REVISION: Final[str] = KNOWN_REVISIONS[-1]
# The SQL that reads the stamp (one row, one column) when alembic_version exists.
STAMP_SQL: Final = "SELECT version_num FROM alembic_version"


def stamped_revision(
    tables: Iterable[str], read_stamps: Callable[[], list[str]], label: str
) -> str | None:
    """Return the stamped revision, None for an empty database; refuse foreign ones.

    ``tables`` are the database's table names; ``read_stamps`` runs :data:`STAMP_SQL`.
    """
    names = set(tables)
    if "alembic_version" not in names:
        if names:
            raise ProvenanceDatabaseError(
                f"{label} has tables but no provenance schema revision; "
                "it is not a provenance database",
                details={"location": label},
            )
        return None
    rows = read_stamps()
    if len(rows) != 1:
        raise ProvenanceDatabaseError(
            f"{label} has {len(rows)} schema revisions stamped; expected one",
            details={"location": label},
        )
    revision = str(rows[0])
    if revision not in KNOWN_REVISIONS:
        raise ProvenanceDatabaseError(
            f"{label} is at schema revision {revision!r}, which this version of "
            f"unattended does not know (it knows up to {HEAD_REVISION!r}); "
            "open it with a newer unattended",
            details={"location": label, "revision": revision, "head": HEAD_REVISION},
        )
    return revision


def require_head(revision: str | None, label: str) -> None:
    """Raise unless ``revision`` is the head (read-only callers never migrate)."""
    if revision is None:
        raise ProvenanceDatabaseError(
            f"{label} is empty: no campaign has been recorded in it",
            details={"location": label},
        )
    if revision != HEAD_REVISION:
        raise ProvenanceDatabaseError(
            f"{label} is at older schema revision {revision!r} (head is "
            f"{HEAD_REVISION!r}); open it for writing once (ProvenanceStore.open) to upgrade",
            details={"location": label, "revision": revision, "head": HEAD_REVISION},
        )
