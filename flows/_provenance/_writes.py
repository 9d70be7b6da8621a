"""Statement helpers shared by the store's writes: idempotent inserts, retries.

Every write is one transaction. Inserts are ``INSERT ... ON CONFLICT DO
NOTHING`` on the row's natural key, so recording an event again after a crash
or a replay leaves the row that is already there. SQLite lock contention and
PostgreSQL serialization failures are retried with jittered backoff.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Table, select
from sqlalchemy.exc import OperationalError

from flows._provenance._engines import Location, begin_write
from flows._provenance._rows import now
from flows._provenance._schema import Campaign, Round, table
from policies import NotFound, ValidationFailed

T = TypeVar("T")

_MAX_TRIES = 12
_PG_RETRY_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
CAMPAIGNS: Table = table(Campaign)
ROUNDS: Table = table(Round)


def _is_transient(exc: OperationalError) -> bool:
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _PG_RETRY_STATES:
        return True
    message = str(orig).lower()
    return "database is locked" in message or "database is busy" in message


def in_transaction(engine: Engine, work: Callable[[Connection], T]) -> T:
    """Run ``work`` in one transaction, retrying it whole on lock contention."""
    delay = 0.005
    for attempt in range(1, _MAX_TRIES + 1):
        try:
            with begin_write(engine) as connection:
                return work(connection)
        except OperationalError as exc:
            if attempt == _MAX_TRIES or not _is_transient(exc):
                raise
        # Jitter so the queued writers do not wake up together again.
        time.sleep(delay * (0.5 + random.random()))  # noqa: S311  # not cryptographic
        delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")  # pragma: no cover


def insert_ignore(
    connection: Connection,
    table: Table,
    values: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    conflict: Sequence[str],
) -> None:
    """Insert rows, leaving any row whose ``conflict`` columns already exist."""
    if not values:
        return
    if connection.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        statement: Any = pg_insert(table).on_conflict_do_nothing(index_elements=list(conflict))
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        statement = sqlite_insert(table).on_conflict_do_nothing(index_elements=list(conflict))
    if isinstance(values, Mapping):
        connection.execute(statement.values(**values))
    else:
        connection.execute(statement, list(values))


def campaign_id(connection: Connection, name: str) -> int | None:
    """Return the id of campaign ``name``, or None."""
    found = connection.execute(select(CAMPAIGNS.c.id).where(CAMPAIGNS.c.name == name)).scalar()
    return None if found is None else int(found)


def ensure_round(connection: Connection, campaign: int, index: int) -> None:
    """Create round ``index`` of ``campaign`` as running unless it exists."""
    insert_ignore(
        connection,
        ROUNDS,
        {"campaign_id": campaign, "round_index": index, "status": "running", "started_at": now()},
        ("campaign_id", "round_index"),
    )


class StoreBase:
    """What every group of the store's writes needs: the engine and campaign ids."""

    def __init__(self, engine: Engine, location: Location, *, read_only: bool) -> None:
        self.engine = engine
        self.location = location
        self.read_only = read_only
        self._campaign_ids: dict[str, int] = {}

    def _id(self, connection: Connection, name: str) -> int:
        cached = self._campaign_ids.get(name)
        if cached is not None:
            return cached
        found = campaign_id(connection, name)
        if found is None:
            raise NotFound(f"no campaign named {name!r}", details={"campaign": name})
        self._campaign_ids[name] = found
        return found


def check_choice(value: str, allowed: tuple[str, ...], what: str) -> None:
    """Raise :class:`ValidationFailed` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValidationFailed(
            f"{what} must be one of {', '.join(allowed)}; got {value!r}",
            details={"field": what},
        )
