"""The provenance store: the campaign's record and its checkpoint.

The campaign flow records every event through :class:`ProvenanceStore`; each
call is one transaction and is idempotent, so a run that is killed or
suspended and replayed from the top records nothing twice and reads its own
checkpoint back with :meth:`ProvenanceStore.load_checkpoint`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import DatabaseError

from flows._provenance import _readers as readers
from flows._provenance._batch_writes import ApprovalAndBatchWrites
from flows._provenance._engines import open_engine, resolve
from flows._provenance._errors import ProvenanceDatabaseError
from flows._provenance._gate_writes import GateWrites
from flows._provenance._migrate import check_readable, upgrade
from flows._provenance._rows import Checkpoint, jsonable, now
from flows._provenance._schema import CAMPAIGN_STATUSES, ROUND_STATUSES
from flows._provenance._writes import (
    CAMPAIGNS,
    ROUNDS,
    check_choice,
    ensure_round,
    in_transaction,
    insert_ignore,
)
from policies import SpecInvalid


class ProvenanceStore(GateWrites, ApprovalAndBatchWrites):
    """Record a campaign's provenance in SQLite or PostgreSQL, and read it back.

    Open it with :meth:`open`. Writes are transactional per event and idempotent
    on each row's natural key; readers return frozen rows from ``_rows``.
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
                upgrade(engine, location)
        except DatabaseError as exc:
            engine.dispose()
            if location.path is None:
                raise  # a server problem (down, refused) is not a broken file
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

        found = in_transaction(self.engine, work)
        self._campaign_ids[name] = found
        return found

    def set_campaign_status(self, name: str, status: str, error_code: str | None = None) -> None:
        """Set the campaign's status (and the stable error code of a stopped run)."""
        check_choice(status, CAMPAIGN_STATUSES, "status")

        def work(connection: Connection) -> None:
            connection.execute(
                update(CAMPAIGNS)
                .where(CAMPAIGNS.c.id == self._id(connection, name))
                .values(status=status, error_code=error_code, updated_at=now())
            )

        in_transaction(self.engine, work)

    def start_round(self, name: str, index: int) -> None:
        """Record round ``index`` as running; a round already recorded is left as it is."""
        in_transaction(self.engine, lambda c: ensure_round(c, self._id(c, name), index))

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
        """Finish round ``index`` with its states and status, in one transaction."""
        check_choice(status, ROUND_STATUSES, "status")
        values = {
            "surrogate_state": jsonable(surrogate_state),
            "policy_state": jsonable(policy_state),
            "planner_state": jsonable(planner_state),
            "status": status,
        }

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            ensure_round(connection, cid, index)
            moment = now()
            connection.execute(
                update(ROUNDS)
                .where(ROUNDS.c.campaign_id == cid, ROUNDS.c.round_index == index)
                .values(finished_at=moment, **values)
            )
            connection.execute(
                update(CAMPAIGNS).where(CAMPAIGNS.c.id == cid).values(updated_at=moment)
            )

        in_transaction(self.engine, work)

    def load_checkpoint(self, name: str) -> Checkpoint:
        """Return where campaign ``name`` stands; an unknown campaign has done nothing yet."""
        with self.engine.connect() as connection:
            return readers.checkpoint(connection, name)

    # -- readers ----------------------------------------------------------------------

    def campaigns(self) -> list[dict[str, Any]]:
        """Return every campaign's name, status, error code, site and round count."""
        with self.engine.connect() as connection:
            return readers.campaigns(connection)

    def summary(self, name: str) -> dict[str, Any]:
        """Return campaign ``name``'s summary (rounds, dispositions, approvals, best result)."""
        with self.engine.connect() as connection:
            return readers.summary(connection, name)

    def round_view(self, name: str, index: int) -> dict[str, Any]:
        """Return everything recorded for one round of campaign ``name``."""
        with self.engine.connect() as connection:
            return readers.round_view(connection, name, index)

    def gate_calls(self, name: str, index: int) -> list[dict[str, Any]]:
        """Return round ``index``'s gate calls, by call index (without attempts)."""
        with self.engine.connect() as connection:
            return readers.gate_calls(connection, readers.require_campaign(connection, name), index)

    def attempts(self, gate_call_id: int) -> list[dict[str, Any]]:
        """Return a gate call's attempts, by number, with verdicts and scores."""
        with self.engine.connect() as connection:
            return readers.attempts(connection, gate_call_id)

    def decisions(self, name: str, index: int) -> list[dict[str, Any]]:
        """Return round ``index``'s policy decisions, by seq."""
        with self.engine.connect() as connection:
            return readers.decisions(connection, readers.require_campaign(connection, name), index)
