"""The campaign's lease, its pinned inputs and its event log (revision 0004).

The lease says which run may act for a campaign: a run takes it in one
transaction at start, renews it while alive, and every later write of its store
checks it (``StoreBase.fence``). It can be taken from its holder only when the
holder released it, when it expired, when the taker is the same owner (a
suspended flow run resumed in a new process), or when the holder's process is
gone from this host. Pins are the content hashes of what the spec names, one set
per input revision; events record what happened around the rounds.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, delete, func, select, update

from flows._provenance._rows import LeaseRow, jsonable, now
from flows._provenance._schema import (
    ENDING_STATUSES,
    CampaignEvent,
    InputPin,
    RunEndingRow,
    table,
)
from flows._provenance._writes import (
    CAMPAIGNS,
    LEASES,
    Fence,
    StoreBase,
    campaign_id,
    check_choice,
    in_transaction,
    insert_ignore,
)

EVENTS: Table = table(CampaignEvent)
PINS: Table = table(InputPin)
ENDINGS: Table = table(RunEndingRow)


def aware(moment: datetime) -> datetime:
    """Return ``moment`` as an aware UTC time (SQLite hands back naive ones)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _lease_row(connection: Connection, campaign: int) -> LeaseRow | None:
    row = connection.execute(select(LEASES).where(LEASES.c.campaign_id == campaign)).first()
    if row is None:
        return None
    return LeaseRow(
        row.owner,
        row.token,
        row.host,
        int(row.pid),
        aware(row.heartbeat_at),
        aware(row.expires_at),
        bool(row.released),
    )


@dataclass(frozen=True)
class Taken:
    """The answer to ``acquire_lease``: taken, or who holds it."""

    acquired: bool
    holder: LeaseRow | None
    token: str


class LeaseAndInputWrites(StoreBase):
    """Lease, input pins and campaign events."""

    def acquire_lease(self, name: str, owner: str, *, ttl: float) -> Taken:
        """Take campaign ``name``'s lease for ``owner`` unless a live run holds it.

        On success this store's writes are fenced by the new token from now on.
        """
        token = uuid.uuid4().hex
        host, pid = socket.gethostname(), os.getpid()

        def work(connection: Connection) -> Taken:
            cid = self._id(connection, name)
            moment = now()
            held = _lease_row(connection, cid)
            if held is not None and not (
                held.expired(moment) or held.owner == owner or held.holder_gone()
            ):
                return Taken(False, held, token)
            values = {
                "owner": owner,
                "token": token,
                "host": host,
                "pid": pid,
                "acquired_at": moment,
                "heartbeat_at": moment,
                "expires_at": moment + timedelta(seconds=ttl),
                "released": False,
            }
            connection.execute(delete(LEASES).where(LEASES.c.campaign_id == cid))
            connection.execute(LEASES.insert().values(campaign_id=cid, **values))
            return Taken(True, held, token)

        taken = in_transaction(self.engine, work)
        if taken.acquired:
            self.fence = Fence(name, token)
        return taken

    def renew_lease(self, name: str, *, ttl: float) -> bool:
        """Extend this store's lease by ``ttl`` seconds; False when it was lost."""
        fence = self.fence
        if fence is None:
            return False

        def work(connection: Connection) -> bool:
            moment = now()
            result = connection.execute(
                update(LEASES)
                .where(
                    LEASES.c.campaign_id == self._id(connection, name),
                    LEASES.c.token == fence.token,
                    LEASES.c.released.is_(False),
                )
                .values(heartbeat_at=moment, expires_at=moment + timedelta(seconds=ttl))
            )
            return bool(result.rowcount)

        return in_transaction(self.engine, work)

    def release_lease(self, name: str) -> None:
        """Give the lease back (a run that ends or suspends); stop fencing."""
        fence = self.fence
        self.fence = None
        if fence is None:
            return

        def work(connection: Connection) -> None:
            connection.execute(
                update(LEASES)
                .where(
                    LEASES.c.campaign_id == self._id(connection, name),
                    LEASES.c.token == fence.token,
                )
                .values(released=True, expires_at=now())
            )

        in_transaction(self.engine, work)

    def lease(self, name: str) -> LeaseRow | None:
        """Return who holds campaign ``name``'s lease (None: never taken or no campaign)."""
        with self.engine.connect() as connection:
            cid = campaign_id(connection, name)
            return None if cid is None else _lease_row(connection, cid)

    # -- events -----------------------------------------------------------------------

    def record_event(
        self,
        name: str,
        kind: str,
        *,
        flow_run_id: str | None = None,
        actor: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Append an event to the campaign's log (not fenced: a fenced-out run says so)."""
        values = {
            "kind": kind,
            "flow_run_id": flow_run_id,
            "actor": actor,
            "details": jsonable(dict(details or {})),
        }
        in_transaction(
            self.engine,
            lambda c: c.execute(
                EVENTS.insert().values(campaign_id=self._id(c, name), recorded_at=now(), **values)
            ),
        )

    def events(self, name: str, kind: str | None = None) -> list[dict[str, Any]]:
        """Return the campaign's events, oldest first (only ``kind`` when given)."""
        with self.engine.connect() as connection:
            cid = campaign_id(connection, name)
            if cid is None:
                return []
            query = select(EVENTS).where(EVENTS.c.campaign_id == cid)
            if kind is not None:
                query = query.where(EVENTS.c.kind == kind)
            return [dict(row._mapping) for row in connection.execute(query.order_by(EVENTS.c.id))]

    # -- how each flow run ended ------------------------------------------------------

    def record_run_ending(
        self, name: str, flow_run_id: str, status: str, code: str | None = None
    ) -> bool:
        """Record how flow run ``flow_run_id`` ended; return whether this call recorded it.

        The first recorded ending stays (a later call returns False). Not fenced: a run
        refused or fenced out records its ending too, and a person's cancel is recorded
        by whoever saw it first (the CLI, the runner's watchdog).
        """
        check_choice(status, ENDING_STATUSES, "status")
        values = {"flow_run_id": flow_run_id, "status": status, "code": code}

        def work(connection: Connection) -> bool:
            row = {"campaign_id": self._id(connection, name), "recorded_at": now(), **values}
            return insert_ignore(connection, ENDINGS, row, ("campaign_id", "flow_run_id")) > 0

        return in_transaction(self.engine, work)

    # -- pinned inputs ----------------------------------------------------------------

    def pinned_inputs(self, name: str) -> tuple[int, dict[str, tuple[str | None, str]]]:
        """Return the latest input revision and its ``{input: (file, sha256)}`` (0, {}: none)."""
        with self.engine.connect() as connection:
            cid = campaign_id(connection, name)
            if cid is None:
                return 0, {}
            revision = connection.execute(
                select(func.max(PINS.c.revision)).where(PINS.c.campaign_id == cid)
            ).scalar()
            if revision is None:
                return 0, {}
            rows = connection.execute(
                select(PINS.c.name, PINS.c.file, PINS.c.sha256).where(
                    PINS.c.campaign_id == cid, PINS.c.revision == revision
                )
            )
            return int(revision), {row.name: (row.file, row.sha256) for row in rows}

    def pin_inputs(
        self,
        name: str,
        revision: int,
        inputs: Mapping[str, tuple[str | None, str]],
        *,
        spec: Mapping[str, Any] | None = None,
    ) -> None:
        """Record ``inputs`` as revision ``revision`` (idempotent); ``spec`` replaces the text."""
        moment = now()
        rows = [
            {
                "revision": revision,
                "name": key,
                "file": file,
                "sha256": digest,
                "recorded_at": moment,
            }
            for key, (file, digest) in sorted(inputs.items())
        ]

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            insert_ignore(
                connection,
                PINS,
                [{"campaign_id": cid, **row} for row in rows],
                ("campaign_id", "revision", "name"),
            )
            if spec is not None:
                connection.execute(
                    update(CAMPAIGNS)
                    .where(CAMPAIGNS.c.id == cid)
                    .values(spec=jsonable(dict(spec)), updated_at=moment)
                )

        in_transaction(self.engine, work)
