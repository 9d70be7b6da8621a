"""The provenance store: the campaign's record and its checkpoint.

The campaign flow records every event through :class:`ProvenanceStore`; each
call is one transaction and is idempotent, so a run that is killed or
suspended and replayed from the top records nothing twice and reads its own
checkpoint back with :meth:`ProvenanceStore.load_checkpoint`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.exc import DatabaseError, OperationalError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from flows._provenance import _readers as readers
from flows._provenance._allocation_writes import AllocationWrites
from flows._provenance._batch_writes import ApprovalAndBatchWrites
from flows._provenance._engines import open_engine, resolve
from flows._provenance._errors import ProvenanceDatabaseError, StorageUnavailable
from flows._provenance._gate_writes import GateWrites
from flows._provenance._lease import LeaseAndInputWrites
from flows._provenance._locations import Location
from flows._provenance._migrate import check_readable, upgrade
from flows._provenance._readers import StoreReads
from flows._provenance._rows import Checkpoint, jsonable, now
from flows._provenance._schema import CAMPAIGN_STATUSES, ROUND_STATUSES
from flows._provenance._sql import AlchemyReader
from flows._provenance._writes import (
    CAMPAIGNS,
    ROUNDS,
    check_choice,
    insert_ignore,
    is_storage_fault,
    is_transient,
)
from policies import SpecInvalid


class ProvenanceStore(
    StoreReads, GateWrites, ApprovalAndBatchWrites, LeaseAndInputWrites, AllocationWrites
):
    """Record a campaign's provenance in SQLite or PostgreSQL, and read it back.

    Open it with :meth:`open`. Writes are transactional per event and idempotent
    on each row's natural key; the readers (:class:`StoreReads`: ``summary``,
    ``round_view``, ...) run the SQL of ``_queries`` on the engine's connection and
    return frozen rows from ``_rows`` or JSON-ready dicts.
    """

    @classmethod
    def open(
        cls, url_or_path: str | os.PathLike[str], *, read_only: bool = False
    ) -> ProvenanceStore:
        """Open (and upgrade to head) the database at a path, directory or URL.

        A directory means ``<dir>/provenance.db``; a ``postgresql+psycopg://`` URL
        means PostgreSQL. With ``read_only`` nothing is created or migrated: a
        missing, empty, corrupt, older or newer database raises
        :class:`ProvenanceDatabaseError`. Without it, a database at a newer unknown
        revision or a non-SQLite file raises the same.
        """
        location = resolve(url_or_path)
        engine = open_engine(location, read_only=read_only)
        try:
            if read_only:
                with engine.connect() as connection:
                    check_readable(connection, location)
            else:
                _upgrade_when_free(engine, location)
        except DatabaseError as exc:
            engine.dispose()
            if location.path is None:
                raise  # a server problem (down, refused) is not a broken file
            if isinstance(exc, OperationalError) and is_storage_fault(exc):
                raise StorageUnavailable(
                    f"cannot write provenance database {location.label}: the disk is full "
                    "or the directory is read-only",
                    details={"path": location.label},
                ) from None
            reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
            raise ProvenanceDatabaseError(
                f"cannot use provenance database {location.label}: {reason or 'unreadable'}",
                details={"path": location.label},
            ) from None
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, location, read_only=read_only)

    def close(self) -> None:
        """Release every connection."""
        self.engine.dispose()

    def __enter__(self) -> ProvenanceStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- campaigns and rounds ---------------------------------------------------------

    def ensure_campaign(
        self, name: str, *, spec: Mapping[str, Any], site: str, seed: int, code_version: str
    ) -> int:
        """Create campaign ``name`` (status running) unless it exists; return its id.

        An existing campaign must have the same spec and seed, so two different
        campaigns never share one record: otherwise :class:`SpecInvalid`.
        """
        spec_json = jsonable(dict(spec))

        def work(connection: Connection) -> int:
            moment = now()
            insert_ignore(
                connection,
                CAMPAIGNS,
                {
                    "name": name,
                    "spec": spec_json,
                    "site": site,
                    "seed": seed,
                    "code_version": code_version,
                    "status": "running",
                    "created_at": moment,
                    "updated_at": moment,
                },
                ("name",),
            )
            row = connection.execute(
                select(CAMPAIGNS.c.id, CAMPAIGNS.c.spec, CAMPAIGNS.c.seed).where(
                    CAMPAIGNS.c.name == name
                )
            ).one()
            if row.spec != spec_json or row.seed != seed:
                raise SpecInvalid(
                    f"campaign {name!r} is already recorded with a different spec or seed; "
                    "give the new campaign another name",
                    details={
                        "campaign": name,
                        "field": "spec" if row.spec != spec_json else "seed",
                    },
                )
            return int(row.id)

        found = self._write(work)
        self._campaign_ids[name] = found
        return found

    def set_campaign_status(
        self,
        name: str,
        status: str,
        error_code: str | None = None,
        *,
        round_index: int | None = None,
    ) -> None:
        """Set the campaign's status (and the stable error code of a stopped run).

        With ``round_index`` that round gets the same status in the same transaction
        (a stopped round is finished then), so ``inspect`` never shows a round still
        ``running`` under a campaign that stopped or waits.
        """
        check_choice(status, CAMPAIGN_STATUSES, "status")

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            moment = now()
            connection.execute(
                update(CAMPAIGNS)
                .where(CAMPAIGNS.c.id == cid)
                .values(status=status, error_code=error_code, updated_at=moment)
            )
            if round_index is not None:
                # A round can stop before anything of it was recorded (its fallback).
                self._ensure_round(connection, cid, round_index)
                stopped = status in ("blocked", "escalated", "failed", "completed")
                connection.execute(
                    update(ROUNDS)
                    .where(ROUNDS.c.campaign_id == cid, ROUNDS.c.round_index == round_index)
                    .values(status=status, finished_at=moment if stopped else None)
                )

        self._write(work)

    def start_round(self, name: str, index: int) -> None:
        """Record round ``index`` as running; a round already recorded is left as it is."""
        self._write(lambda c: self._ensure_round(c, self._id(c, name), index))

    def checkpoint_round(
        self,
        name: str,
        index: int,
        *,
        surrogate_state: Any,
        policy_state: Any,
        planner_state: Any,
        status: str,
    ) -> None:
        """Finish round ``index`` with its states and status, in one transaction.

        The engine's ``surrogate_state`` is what the round added (an increment; see
        ``GaussianProcess.to_state``): every completed round's is read back, in order,
        by :meth:`load_checkpoint`. A whole state on every round grew the record with
        the square of the rounds (~0.3 GB at 1,000 rounds of 8).
        """
        check_choice(status, ROUND_STATUSES, "status")
        values = {
            "surrogate_state": jsonable(surrogate_state),
            "policy_state": jsonable(policy_state),
            "planner_state": jsonable(planner_state),
            "status": status,
        }

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            self._ensure_round(connection, cid, index)
            moment = now()
            # The new values go as parameters: a compiled statement SQLAlchemy caches.
            connection.execute(
                update(ROUNDS).where(ROUNDS.c.campaign_id == cid, ROUNDS.c.round_index == index),
                {"finished_at": moment, **values},
            )
            connection.execute(
                update(CAMPAIGNS).where(CAMPAIGNS.c.id == cid), {"updated_at": moment}
            )

        self._write(work)

    def load_checkpoint(self, name: str) -> Checkpoint:
        """Return where campaign ``name`` stands; an unknown campaign has done nothing yet."""
        with self.reading() as reader:
            return readers.checkpoint(reader, name)

    @contextlib.contextmanager
    def reading(self) -> Iterator[AlchemyReader]:
        """Yield a reader on one connection (one read transaction): the readers' queries."""
        with self.engine.connect() as connection:
            yield AlchemyReader(connection)


# SQLite can answer "database is locked" at once, without waiting out the busy timeout,
# while several processes open a fresh file together (its switch to WAL); seen once in
# eight processes at load 4. Opening again after a short pause then succeeds.
_LOCKED_RETRIES = 5


def _upgrade_when_free(engine: Engine, location: Location) -> None:
    """Upgrade to head, trying again a few times while another process holds a fresh file."""

    def locked(exc: BaseException) -> bool:  # SQLite busy/locked
        return location.path is not None and isinstance(exc, OperationalError) and is_transient(exc)

    # Budget: 5 tries, 50 ms doubling between them.
    Retrying(
        retry=retry_if_exception(locked),
        stop=stop_after_attempt(_LOCKED_RETRIES),
        wait=wait_exponential(multiplier=0.05),
        reraise=True,
    )(upgrade, engine, location)
