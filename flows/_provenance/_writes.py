"""Statement helpers shared by the store's writes: idempotent inserts, retries.

Every write is one transaction. Inserts are ``INSERT ... ON CONFLICT DO
NOTHING`` on the row's natural key, so recording an event again after a crash
or a replay leaves the row that is already there. SQLite lock contention and
PostgreSQL serialization failures are retried with jittered backoff. A full disk
or a read-only directory is retried too, a bounded number of times with a longer
backoff (``StorageRetry``), then raises ``StorageUnavailable``. A store that holds
the campaign's lease (``StoreBase.fence``) checks it inside every write transaction,
so a run that lost the lease records nothing more.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Table, select
from sqlalchemy.exc import OperationalError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from flows._provenance._engines import begin_write
from flows._provenance._errors import CampaignFenced, StorageUnavailable
from flows._provenance._locations import Location, is_storage_fault_message
from flows._provenance._rows import now
from flows._provenance._schema import Campaign, CampaignLease, Round, table
from policies import NotFound, ValidationFailed

T = TypeVar("T")

_MAX_TRIES = 12
_PG_RETRY_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
CAMPAIGNS: Table = table(Campaign)
ROUNDS: Table = table(Round)
LEASES: Table = table(CampaignLease)


@dataclass(frozen=True)
class StorageRetry:
    """How often, and how patiently, a write refused by the file system is tried again.

    Args:
        tries: Attempts in all (1 means no retry), 1-50.
        first_delay: Seconds before the second attempt; doubled each time, at most 30 s.
    """

    tries: int = 6
    first_delay: float = 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StorageRetry:
        """Read ``UNATTENDED_STORAGE_RETRIES`` and ``UNATTENDED_STORAGE_BACKOFF_SECONDS``."""
        # Every write asks: build the settings once per distinct pair of values.
        return _storage_retry(
            env.get("UNATTENDED_STORAGE_RETRIES"), env.get("UNATTENDED_STORAGE_BACKOFF_SECONDS")
        )


@functools.lru_cache(maxsize=8)
def _storage_retry(tries: str | None, backoff: str | None) -> StorageRetry:
    from flows._settings import Settings

    given = {"UNATTENDED_STORAGE_RETRIES": tries, "UNATTENDED_STORAGE_BACKOFF_SECONDS": backoff}
    settings = Settings.from_env({k: v for k, v in given.items() if v is not None})
    return StorageRetry(settings.storage_retries, settings.storage_backoff_seconds)


def is_storage_fault(exc: OperationalError) -> bool:
    """Return whether SQLite refused a write because of the disk or the directory."""
    return is_storage_fault_message(str(exc.orig))


def is_transient(exc: OperationalError) -> bool:
    """Return whether a write failed on lock contention (SQLite busy, PostgreSQL conflicts)."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _PG_RETRY_STATES:
        return True
    message = str(orig).lower()
    return "database is locked" in message or "database is busy" in message


def in_transaction(
    engine: Engine, work: Callable[[Connection], T], retry: StorageRetry | None = None
) -> T:
    """Run ``work`` in one transaction, retrying it whole on lock contention or a disk fault."""
    storage = retry or StorageRetry.from_env(os.environ)

    def once() -> T:
        with begin_write(engine) as connection:
            return work(connection)

    # Budget: lock contention 12 tries, 5 ms doubling to 1 s between them, jittered.
    contended = Retrying(
        retry=retry_if_exception(_contended),
        stop=stop_after_attempt(_MAX_TRIES),
        wait=_contention_wait,
        reraise=True,
    )
    if storage.tries <= 1:
        result: T = contended(once)
        return result
    try:
        # Budget: a disk fault `storage.tries` tries, first_delay doubling to 30 s between.
        result = Retrying(
            retry=retry_if_exception(_storage_fault),
            stop=stop_after_attempt(storage.tries),
            wait=wait_exponential(multiplier=storage.first_delay, max=30.0),
            reraise=True,
        )(contended, once)
    except OperationalError as exc:
        if not is_storage_fault(exc):
            raise
        raise StorageUnavailable(
            f"the provenance database cannot be written after {storage.tries} tries "
            f"({str(exc.orig).strip().splitlines()[0]})",
            details={"tries": storage.tries},
        ) from None
    return result


def _contended(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError) and is_transient(exc)


def _storage_fault(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError) and is_storage_fault(exc)


def _contention_wait(state: RetryCallState) -> float:
    # Jitter so the queued writers do not wake up together again.
    delay = min(0.005 * 2.0 ** (state.attempt_number - 1), 1.0)
    return delay * (0.5 + random.random())  # noqa: S311  # not cryptographic


def insert_ignore(
    connection: Connection,
    table: Table,
    values: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    conflict: Sequence[str],
) -> int:
    """Insert rows, leaving any row whose ``conflict`` columns already exist; return how many.

    The count is what the database reports (SQLite and PostgreSQL count the rows
    inserted, not those left).
    """
    if not values:
        return 0
    if connection.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        statement: Any = pg_insert(table).on_conflict_do_nothing(index_elements=list(conflict))
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        statement = sqlite_insert(table).on_conflict_do_nothing(index_elements=list(conflict))
    # The rows go as parameters, never into the statement: one compiled statement a
    # table, found in SQLAlchemy's cache, instead of one built for each row's values.
    result = connection.execute(
        statement, dict(values) if isinstance(values, Mapping) else list(values)
    )
    return max(int(result.rowcount or 0), 0)


def campaign_id(connection: Connection, name: str) -> int | None:
    """Return the id of campaign ``name``, or None."""
    found = connection.execute(select(CAMPAIGNS.c.id).where(CAMPAIGNS.c.name == name)).scalar()
    return None if found is None else int(found)


def ensure_round(
    connection: Connection, campaign: int, index: int, started_at: datetime | None = None
) -> None:
    """Create round ``index`` of ``campaign`` as running unless it exists.

    ``started_at`` is when the round began, if earlier than this write (now).
    """
    insert_ignore(
        connection,
        ROUNDS,
        {
            "campaign_id": campaign,
            "round_index": index,
            "status": "running",
            "started_at": started_at or now(),
        },
        ("campaign_id", "round_index"),
    )


@dataclass(frozen=True)
class Fence:
    """The lease a store's writes must still hold: campaign name and this process's token."""

    campaign: str
    token: str


def check_fence(connection: Connection, campaign: int, fence: Fence) -> None:
    """Raise :class:`CampaignFenced` unless ``fence`` still holds the campaign's lease."""
    row = connection.execute(
        select(LEASES.c.token, LEASES.c.owner, LEASES.c.released).where(
            LEASES.c.campaign_id == campaign
        )
    ).first()
    if row is None or row.token != fence.token or row.released:
        holder = row.owner if row is not None else None
        raise CampaignFenced(
            f"campaign {fence.campaign!r}: this run no longer holds its lease "
            f"(held by {holder or 'nobody'}); it records and launches nothing more",
            details={"campaign": fence.campaign, "holder": holder},
        )


class StoreBase:
    """What every group of the store's writes needs: the engine, campaign ids, the fence."""

    def __init__(self, engine: Engine, location: Location, *, read_only: bool) -> None:
        self.engine = engine
        self.location = location
        self.read_only = read_only
        self._campaign_ids: dict[str, int] = {}
        self.fence: Fence | None = None
        # Rounds this store has seen committed (rows are never deleted), and the ones
        # the transaction under way created: known only once it commits.
        self._known_rounds: set[tuple[int, int]] = set()
        self._new_rounds: list[tuple[int, int]] = []

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one write transaction that first checks the fence, if any."""
        fence = self.fence
        # A store opened read-only is refused by design: say so at once.
        retry = StorageRetry(tries=1) if self.read_only else None

        def attempt(connection: Connection) -> T:
            self._new_rounds = []  # a retried transaction starts again
            if fence is not None:
                check_fence(connection, self._id(connection, fence.campaign), fence)
            return work(connection)

        result = in_transaction(self.engine, attempt, retry)
        self._known_rounds.update(self._new_rounds)
        return result

    def _ensure_round(
        self, connection: Connection, campaign: int, index: int, started_at: datetime | None = None
    ) -> None:
        """:func:`ensure_round`, once per round a store has seen committed.

        Most writes of a round name it (replays need that); after the first, the
        insert would find the row, so it is not sent again.
        """
        if (campaign, index) in self._known_rounds:
            return
        ensure_round(connection, campaign, index, started_at)
        self._new_rounds.append((campaign, index))

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
