"""The provenance store: the campaign's record and its checkpoint.

The campaign flow records every event through :class:`ProvenanceStore`; each
call is one transaction and is idempotent, so a run that is killed or
suspended and replayed from the top records nothing twice and reads its own
checkpoint back with :meth:`ProvenanceStore.load_checkpoint`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.exc import IntegrityError

from flows._provenance import _readers as readers
from flows._provenance._engines import Location, open_engine, resolve
from flows._provenance._migrate import check_readable, upgrade
from flows._provenance._rows import (
    TASK_RESULT_FIELDS,
    ApprovalRow,
    Checkpoint,
    TaskResultRecord,
    field,
    jsonable,
    now,
    objective_of,
)
from flows._provenance._schema import (
    APPROVAL_DECISIONS,
    CAMPAIGN_STATUSES,
    DISPOSITIONS,
    ROUND_STATUSES,
    Approval,
    ApprovalEvent,
    AttemptRow,
    Batch,
    GateCall,
    PolicyDecision,
    TaskResultRow,
)
from flows._provenance._writes import (
    CAMPAIGNS,
    ROUNDS,
    campaign_id,
    ensure_round,
    in_transaction,
    insert_ignore,
)
from policies import InternalError, NotFound, ValidationFailed

GATE_CALLS = GateCall.__table__  # type: ignore[attr-defined]  # sqlmodel sets __table__
ATTEMPTS = AttemptRow.__table__  # type: ignore[attr-defined]
DECISIONS = PolicyDecision.__table__  # type: ignore[attr-defined]
APPROVALS = Approval.__table__  # type: ignore[attr-defined]
APPROVAL_EVENTS = ApprovalEvent.__table__  # type: ignore[attr-defined]
BATCHES = Batch.__table__  # type: ignore[attr-defined]
TASK_RESULTS = TaskResultRow.__table__  # type: ignore[attr-defined]
_DECISION_FIELDS = (
    "outcome", "reason", "code", "rules_fired", "severities", "explanation", "shadow",
    "state_after",
)


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValidationFailed(
            f"{what} must be one of {', '.join(allowed)}; got {value!r}",
            details={"field": what},
        )


def _attempt_values(gate_call_id: int, attempt: Any) -> dict[str, Any]:
    data = attempt.model_dump(mode="json") if hasattr(attempt, "model_dump") else dict(attempt)
    if not isinstance(data.get("number"), int):
        raise ValidationFailed("attempt.number must be an integer", details={"field": "number"})
    verdicts = [
        {k: field(v, k) for k in ("check", "passed", "reason", "duration")}
        for v in data.get("verdicts") or ()
    ]
    return {
        "gate_call_id": gate_call_id,
        "number": data["number"],
        "value": jsonable(data.get("value")),
        "rejected_by": data.get("rejected_by"),
        "reason": data.get("reason"),
        "verdicts": jsonable(verdicts),
        "scores": jsonable(dict(data.get("scores") or {})),
        "duration": float(data.get("duration") or 0.0),
        "trace_id": data.get("trace_id"),
        "span_id": data.get("span_id"),
    }


class ProvenanceStore:
    """Record a campaign's provenance in SQLite or PostgreSQL, and read it back.

    Open it with :meth:`open`. Writes are transactional per event and idempotent
    on each row's natural key; readers return frozen rows from ``_rows``.
    """

    def __init__(self, engine: Engine, location: Location, *, read_only: bool) -> None:
        self.engine = engine
        self.location = location
        self.read_only = read_only
        self._campaign_ids: dict[str, int] = {}

    @classmethod
    def open(cls, url_or_path: str | os.PathLike[str], *, read_only: bool = False) -> ProvenanceStore:
        """Open (and upgrade to head) the database at a path, directory or URL.

        A directory means ``<dir>/provenance.db``; a ``postgresql+psycopg://`` URL
        means PostgreSQL. With ``read_only`` nothing is created or migrated: a
        missing, empty, corrupt, older or newer database raises
        :class:`ProvenanceUnusable`. Without it, a database at a newer unknown
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

    def _id(self, connection: Connection, name: str) -> int:
        cached = self._campaign_ids.get(name)
        if cached is not None:
            return cached
        found = campaign_id(connection, name)
        if found is None:
            raise NotFound(f"no campaign named {name!r}", details={"campaign": name})
        self._campaign_ids[name] = found
        return found

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
                {"name": name, "spec": spec_json, "site": site, "seed": seed,
                 "code_version": code_version, "status": "running",
                 "created_at": moment, "updated_at": moment},
                ("name",),
            )
            row = connection.execute(
                select(CAMPAIGNS.c.id, CAMPAIGNS.c.spec, CAMPAIGNS.c.seed).where(
                    CAMPAIGNS.c.name == name
                )
            ).one()
            if row.spec != spec_json or row.seed != seed:
                from policies import SpecInvalid

                raise SpecInvalid(
                    f"campaign {name!r} is already recorded with a different spec or seed; "
                    "give the new campaign another name",
                    details={"campaign": name, "field": "spec" if row.spec != spec_json else "seed"},
                )
            return int(row.id)

        found = in_transaction(self.engine, work)
        self._campaign_ids[name] = found
        return found

    def set_campaign_status(self, name: str, status: str, error_code: str | None = None) -> None:
        """Set the campaign's status (and the stable error code of a stopped run)."""
        _check(status, CAMPAIGN_STATUSES, "status")

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
        _check(status, ROUND_STATUSES, "status")
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
            connection.execute(update(CAMPAIGNS).where(CAMPAIGNS.c.id == cid).values(updated_at=moment))

        in_transaction(self.engine, work)

    def load_checkpoint(self, name: str) -> Checkpoint:
        """Return where campaign ``name`` stands; an unknown campaign has done nothing yet."""
        with self.engine.connect() as connection:
            return readers.checkpoint(connection, name)

    # -- the gate ---------------------------------------------------------------------

    def record_gate_call(
        self,
        name: str,
        index: int,
        call_index: int,
        *,
        gate: str,
        budget: int,
        fallback_hash: str | None,
        fallback_value: Any,
    ) -> int:
        """Record a gate call with its fallback (before any attempt); return its id.

        Recording it again returns the same id. A different ``fallback_hash`` for
        the same call means the fallback is not deterministic: :class:`InternalError`.
        """
        fallback_json = jsonable(fallback_value)

        def work(connection: Connection) -> int:
            cid = self._id(connection, name)
            ensure_round(connection, cid, index)
            insert_ignore(
                connection,
                GATE_CALLS,
                {"campaign_id": cid, "round_index": index, "call_index": call_index,
                 "name": gate, "budget": budget, "attempts_used": 0, "disposition": "pending",
                 "fallback_hash": fallback_hash, "fallback_value": fallback_json,
                 "fallback_computed_at": now()},
                ("campaign_id", "round_index", "call_index"),
            )
            row = connection.execute(
                select(GATE_CALLS.c.id, GATE_CALLS.c.fallback_hash).where(
                    GATE_CALLS.c.campaign_id == cid,
                    GATE_CALLS.c.round_index == index,
                    GATE_CALLS.c.call_index == call_index,
                )
            ).one()
            if row.fallback_hash != fallback_hash:
                raise InternalError(
                    f"gate call {row.id} (campaign {name!r}, round {index}, call {call_index}) "
                    "was recorded with a different fallback hash: the fallback is not "
                    "deterministic",
                    details={"gate_call_id": row.id, "round": index, "call_index": call_index},
                )
            return int(row.id)

        return in_transaction(self.engine, work)

    def record_attempt(self, gate_call_id: int, attempt: Any) -> None:
        """Record one ``acceptance.Attempt`` (or its ``model_dump``) with its verdicts."""
        self.record_attempts(gate_call_id, [attempt])

    def record_attempts(self, gate_call_id: int, attempts: Iterable[Any]) -> None:
        """Record many attempts of one gate call in one transaction (bulk loads)."""
        rows = [_attempt_values(gate_call_id, a) for a in attempts]

        def work(connection: Connection) -> None:
            insert_ignore(connection, ATTEMPTS, rows, ("gate_call_id", "number"))

        try:
            in_transaction(self.engine, work)
        except IntegrityError:
            raise NotFound(
                f"no gate call with id {gate_call_id}", details={"gate_call_id": gate_call_id}
            ) from None

    def finish_gate_call(self, gate_call_id: int, disposition: str, attempts_used: int) -> None:
        """Record how the gate call ended and how many attempts it used."""
        _check(disposition, DISPOSITIONS, "disposition")

        def work(connection: Connection) -> None:
            result = connection.execute(
                update(GATE_CALLS)
                .where(GATE_CALLS.c.id == gate_call_id)
                .values(disposition=disposition, attempts_used=attempts_used)
            )
            if result.rowcount == 0:
                raise NotFound(
                    f"no gate call with id {gate_call_id}", details={"gate_call_id": gate_call_id}
                )

        in_transaction(self.engine, work)

    # -- policies and approvals -------------------------------------------------------

    def record_decision(self, name: str, index: int, seq: int, record: Mapping[str, Any]) -> None:
        """Record the policy decision ``seq`` of a round (``Decision.to_record()``).

        Known keys fill their columns; any other key is kept in ``extra``.
        """
        if not record.get("outcome"):
            raise ValidationFailed("decision record needs an outcome", details={"field": "outcome"})
        data = jsonable(dict(record))
        values = {k: data.get(k) for k in _DECISION_FIELDS}
        extra = {k: v for k, v in data.items() if k not in _DECISION_FIELDS}

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            ensure_round(connection, cid, index)
            insert_ignore(
                connection,
                DECISIONS,
                {"campaign_id": cid, "round_index": index, "seq": seq, **values,
                 "extra": extra or None, "recorded_at": now()},
                ("campaign_id", "round_index", "seq"),
            )

        in_transaction(self.engine, work)

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
    ) -> None:
        """Persist an approval request before the run suspends; idempotent on ``key``."""
        allowed = sorted(set(approvers))

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            ensure_round(connection, cid, index)
            insert_ignore(
                connection,
                APPROVALS,
                {"campaign_id": cid, "round_index": index, "key": key, "rule": rule,
                 "approvers_allowed": allowed, "requested_at": now(),
                 "description": description, "flow_run_id": flow_run_id},
                ("key",),
            )

        in_transaction(self.engine, work)

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
    ) -> bool:
        """Record one decision attempt on approval ``key``; return True if it settled it.

        Every call adds an ``approval_event`` row (a refused approver too, with
        ``allowed=False``). The first allowed event settles the approval; later
        ones are kept as events only. Pass ``event_key`` (the flow run input id,
        say) to make a replay record the event once.
        """
        _check(decision, APPROVAL_DECISIONS, "decision")
        overrides_json = jsonable(overrides)

        def work(connection: Connection) -> bool:
            approval = connection.execute(
                select(APPROVALS.c.id, APPROVALS.c.decision).where(APPROVALS.c.key == key)
            ).one_or_none()
            if approval is None:
                raise NotFound(f"no approval request with key {key!r}", details={"key": key})
            if event_key is not None and connection.execute(
                select(APPROVAL_EVENTS.c.id).where(
                    APPROVAL_EVENTS.c.approval_id == approval.id,
                    APPROVAL_EVENTS.c.event_key == event_key,
                )
            ).first():
                return False
            settles = allowed and approval.decision is None
            moment = now()
            connection.execute(
                APPROVAL_EVENTS.insert().values(
                    approval_id=approval.id, event_key=event_key, decided_by=decided_by,
                    decision=decision, comment=comment, overrides=overrides_json,
                    allowed=allowed, settled=settles, recorded_at=moment,
                )
            )
            if settles:
                connection.execute(
                    update(APPROVALS)
                    .where(APPROVALS.c.id == approval.id)
                    .values(decided_by=decided_by, decision=decision, comment=comment,
                            overrides=overrides_json, decided_at=moment)
                )
            return settles

        return in_transaction(self.engine, work)

    def find_approval(self, key: str) -> ApprovalRow | None:
        """Return approval ``key`` with its events, or None if it was never requested."""
        with self.engine.connect() as connection:
            return readers.approval(connection, key)

    # -- batches (the BatchStore protocol) --------------------------------------------

    def record_batch_launched(
        self, key: str, *, campaign: str, round_index: int, candidates: Iterable[Any], backend: str
    ) -> None:
        """Record that batch ``key`` was launched; idempotent on ``key``."""
        candidates_json = jsonable(list(candidates))

        def work(connection: Connection) -> None:
            cid = self._id(connection, campaign)
            ensure_round(connection, cid, round_index)
            insert_ignore(
                connection,
                BATCHES,
                {"key": key, "campaign_id": cid, "round_index": round_index,
                 "candidates": candidates_json, "backend": backend, "launched_at": now(),
                 "status": "launched"},
                ("key",),
            )

        in_transaction(self.engine, work)

    def record_batch_results(self, key: str, results: Iterable[Any]) -> None:
        """Record batch ``key``'s task results and mark it finished, in one transaction.

        ``results`` are ``tasks.TaskResult`` objects or dicts with the same
        fields; a result already recorded for an index is kept.
        """
        items = list(results)

        def work(connection: Connection) -> None:
            batch = connection.execute(
                select(BATCHES.c.id, BATCHES.c.candidates).where(BATCHES.c.key == key)
            ).one_or_none()
            if batch is None:
                raise NotFound(f"no batch launched with key {key!r}", details={"batch": key})
            candidates = batch.candidates or []
            rows = []
            for item in items:
                values = {name: field(item, name) for name in TASK_RESULT_FIELDS}
                task_index = int(values.pop("index"))
                value = jsonable(values["value"])
                rows.append({
                    **values,
                    "batch_id": batch.id,
                    "task_index": task_index,
                    "value": value,
                    "objective": objective_of(value),
                    "retries": jsonable(values["retries"]),
                    "attempts": int(values["attempts"] or 1),
                    "candidate": (
                        candidates[task_index] if 0 <= task_index < len(candidates) else None
                    ),
                })
            insert_ignore(connection, TASK_RESULTS, rows, ("batch_id", "task_index"))
            connection.execute(
                update(BATCHES)
                .where(BATCHES.c.id == batch.id, BATCHES.c.status == "launched")
                .values(status="finished", finished_at=now())
            )

        in_transaction(self.engine, work)

    def find_batch(self, key: str) -> list[TaskResultRecord] | None:
        """Return a finished batch's results (by index), or None if it has not finished."""
        with self.engine.connect() as connection:
            return readers.finished_batch(connection, key)

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
