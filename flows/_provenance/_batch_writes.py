"""The store's writes for approvals and batches (the ``BatchStore`` protocol)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from flows._provenance import _readers as readers
from flows._provenance._allocation_writes import allocation_times
from flows._provenance._rows import (
    TASK_RESULT_FIELDS,
    TaskResultRecord,
    field,
    jsonable,
    now,
    objective_of,
)
from flows._provenance._schema import (
    APPROVAL_DECISIONS,
    TASK_STATUSES,
    Approval,
    ApprovalEvent,
    Batch,
    TaskResultRow,
    table,
)
from flows._provenance._sql import AlchemyReader
from flows._provenance._writes import (
    StoreBase,
    check_choice,
    insert_ignore,
)
from policies import NotFound

APPROVALS = table(Approval)
APPROVAL_EVENTS = table(ApprovalEvent)
BATCHES = table(Batch)
TASK_RESULTS = table(TaskResultRow)


class ApprovalAndBatchWrites(StoreBase):
    """Record approval requests and decisions, launched batches and their results.

    ``find_batch`` returns :class:`TaskResultRecord` objects (attributes, not dicts).
    """

    def record_approval_request(
        self,
        name: str,
        index: int,
        *,
        key: str,
        rule: str | None,
        approvers: Iterable[str],
        description: str | None,
        flow_run_id: str | None,
        allocation_start: datetime | None = None,
        allocation_end: datetime | None = None,
        require_proof: bool | None = None,
        allow_override: bool | None = None,
    ) -> None:
        """Persist an approval request before the run suspends; idempotent on ``key``.

        ``allocation_start``/``allocation_end`` are the batch allocation's window as
        the requesting process sees it (aware datetimes; None when unknown).
        """
        allowed = sorted(set(approvers))

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            self._ensure_round(connection, cid, index)
            insert_ignore(
                connection,
                APPROVALS,
                {
                    "campaign_id": cid,
                    "round_index": index,
                    "key": key,
                    "rule": rule,
                    "approvers_allowed": allowed,
                    "requested_at": now(),
                    "description": description,
                    "allocation_start": allocation_start,
                    "allocation_end": allocation_end,
                    "flow_run_id": flow_run_id,
                    "require_proof": require_proof,
                    "allow_override": allow_override,
                },
                ("key",),
            )

        self._write(work)

    def record_approval_event(
        self,
        key: str,
        *,
        decided_by: str | None,
        decision: str,
        comment: str | None = None,
        overrides: Any = None,
        allowed: bool,
        event_key: str | None = None,
        proof: str | None = None,
        refusal: str | None = None,
    ) -> bool:
        """Record one decision attempt on approval ``key``; return True if it settled it.

        Every call adds an ``approval_event`` row (a refused approver too, with
        ``allowed=False``). The first allowed event settles the approval; later
        ones are kept as events only. Pass ``event_key`` (the flow run input id,
        say) to make a replay record the event once. ``proof`` says how the
        approver proved who they are (``"totp ok"``, ``"totp failed"``, ...).
        """
        check_choice(decision, APPROVAL_DECISIONS, "decision")
        overrides_json = jsonable(overrides)

        def work(connection: Connection) -> bool:
            approval = connection.execute(
                select(APPROVALS.c.id, APPROVALS.c.decision).where(APPROVALS.c.key == key)
            ).one_or_none()
            if approval is None:
                raise NotFound(f"no approval request with key {key!r}", details={"key": key})
            if (
                event_key is not None
                and connection.execute(
                    select(APPROVAL_EVENTS.c.id).where(
                        APPROVAL_EVENTS.c.approval_id == approval.id,
                        APPROVAL_EVENTS.c.event_key == event_key,
                    )
                ).first()
            ):
                return False
            moment = now()
            settles = False
            if allowed and approval.decision is None:
                # Conditional update: of two allowed decisions racing on PostgreSQL,
                # exactly one finds the request still undecided.
                settles = (
                    connection.execute(
                        update(APPROVALS)
                        .where(APPROVALS.c.id == approval.id, APPROVALS.c.decision.is_(None))
                        .values(
                            decided_by=decided_by,
                            decision=decision,
                            comment=comment,
                            overrides=overrides_json,
                            decided_at=moment,
                        )
                    ).rowcount
                    == 1
                )
            connection.execute(
                APPROVAL_EVENTS.insert().values(
                    approval_id=approval.id,
                    event_key=event_key,
                    decided_by=decided_by,
                    decision=decision,
                    comment=comment,
                    overrides=overrides_json,
                    allowed=allowed,
                    settled=settles,
                    recorded_at=moment,
                    proof=proof,
                    refusal=refusal,
                )
            )
            return settles

        try:
            return self._write(work)
        except IntegrityError:
            if event_key is None:
                raise
            # Another process recorded the same event between our check and insert;
            # running again finds it and records nothing.
            return self._write(work)

    def record_batch_launched(
        self,
        key: str,
        *,
        campaign: str,
        round_index: int,
        candidates: Iterable[Any],
        backend: str,
        relaunch: int = 0,
    ) -> None:
        """Record that batch ``key`` was launched; idempotent on ``key``.

        ``relaunch`` is 0 for a round's batch and n for the n-th relaunch of its
        interrupted candidates.
        """
        candidates_json = jsonable(list(candidates))

        def work(connection: Connection) -> None:
            cid = self._id(connection, campaign)
            self._ensure_round(connection, cid, round_index)
            insert_ignore(
                connection,
                BATCHES,
                {
                    "key": key,
                    "campaign_id": cid,
                    "round_index": round_index,
                    "candidates": candidates_json,
                    "backend": backend,
                    "launched_at": now(),
                    "status": "launched",
                    "relaunch": int(relaunch),
                },
                ("key",),
            )

        self._write(work)

    def record_batch_results(self, key: str, results: Iterable[Any]) -> None:
        """Record batch ``key``'s task results and mark it finished, in one transaction.

        ``results`` are ``tasks.TaskResult`` objects or dicts with the same
        fields; a result already recorded for an index is kept. A result that names
        its job (``job_id``) gets that allocation's start and planned end, when the
        allocation is recorded. A relaunch batch's candidates are the round's
        interrupted ones, in order; its results are numbered within it.
        """
        items = list(results)

        def work(connection: Connection) -> None:
            batch = connection.execute(
                select(BATCHES.c.id, BATCHES.c.candidates, BATCHES.c.campaign_id).where(
                    BATCHES.c.key == key
                )
            ).one_or_none()
            if batch is None:
                raise NotFound(f"no batch launched with key {key!r}", details={"batch": key})
            candidates = batch.candidates or []
            windows = allocation_times(connection, batch.campaign_id)
            rows = []
            for item in items:
                values = {name: field(item, name) for name in TASK_RESULT_FIELDS}
                check_choice(values["status"], TASK_STATUSES, "status")
                task_index = int(values.pop("index"))
                value = jsonable(values["value"])
                start, end = windows.get(str(values["job_id"]), (None, None))
                rows.append(
                    {
                        **values,
                        "allocation_start": start,
                        "allocation_end": end,
                        "batch_id": batch.id,
                        "task_index": task_index,
                        "value": value,
                        "objective": objective_of(value),
                        "retries": jsonable(values["retries"]),
                        "attempts": int(values["attempts"] or 1),
                        "candidate": (
                            candidates[task_index] if 0 <= task_index < len(candidates) else None
                        ),
                    }
                )
            insert_ignore(connection, TASK_RESULTS, rows, ("batch_id", "task_index"))
            connection.execute(
                update(BATCHES).where(BATCHES.c.id == batch.id, BATCHES.c.status == "launched"),
                {"status": "finished", "finished_at": now()},
            )

        self._write(work)

    def find_batch(self, key: str) -> list[TaskResultRecord] | None:
        """Return a finished batch's results (by index), or None if it has not finished."""
        with self.engine.connect() as connection:
            return readers.finished_batch(AlchemyReader(connection), key)
