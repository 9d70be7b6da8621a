"""The store's writes for the accept gate and the policy decisions."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.exc import IntegrityError

from flows._provenance._rows import CandidateFateRecord, GateCallEnd, jsonable, now
from flows._provenance._schema import (
    CANDIDATE_FATES,
    CANDIDATE_SOURCES,
    DISPOSITIONS,
    AttemptRow,
    CandidateFateRow,
    GateCall,
    PolicyDecision,
    table,
)
from flows._provenance._writes import (
    StoreBase,
    check_choice,
    insert_ignore,
)
from policies import InternalError, NotFound, ValidationFailed

GATE_CALLS = table(GateCall)
ATTEMPTS = table(AttemptRow)
DECISIONS = table(PolicyDecision)
FATES = table(CandidateFateRow)
_DECISION_FIELDS = (
    "outcome",
    "reason",
    "code",
    "rules_fired",
    "severities",
    "explanation",
    "shadow",
    "state_after",
)


def _reader(obj: Any) -> Callable[[str], Any]:
    if isinstance(obj, dict):
        return obj.get
    return lambda name: getattr(obj, name, None)


def _attempt_values(gate_call_id: int, attempt: Any) -> dict[str, Any]:
    # JSON columns take Python objects as they are: the engine's serializer writes
    # strict JSON (pydantic models, dataclasses, tuples, NaN/inf as strings) in one pass.
    get = _reader(attempt)
    number = get("number")
    if not isinstance(number, int):
        raise ValidationFailed("attempt.number must be an integer", details={"field": "number"})
    verdicts = []
    for verdict in get("verdicts") or ():
        read = _reader(verdict)
        entry = {
            "check": read("check"),
            "passed": read("passed"),
            "reason": read("reason"),
            "duration": read("duration"),
        }
        details = read("details")
        if details:
            # What the check did: the verifier's tasks with their Slurm job ids.
            entry["details"] = jsonable(dict(details))
        verdicts.append(entry)
    return {
        "gate_call_id": gate_call_id,
        "number": number,
        "value": get("value"),
        "rejected_by": get("rejected_by"),
        "failed_by": get("failed_by"),
        "reason": get("reason"),
        "verdicts": verdicts,
        "scores": dict(get("scores") or {}),
        "duration": float(get("duration") or 0.0),
        "trace_id": get("trace_id"),
        "span_id": get("span_id"),
    }


class GateWrites(StoreBase):
    """Record gate calls (fallback first), attempts and policy decisions."""

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
        round_started_at: datetime | None = None,
    ) -> int:
        """Record a gate call with its fallback (before any attempt); return its id.

        Recording it again returns the same id. A different ``fallback_hash`` for
        the same call means the fallback is not deterministic: :class:`InternalError`.
        The round is recorded too, unless it is, as started at ``round_started_at``
        (when the caller began it, before the fallback was computed), else now.
        """
        fallback_json = jsonable(fallback_value)

        def work(connection: Connection) -> int:
            cid = self._id(connection, name)
            self._ensure_round(connection, cid, index, round_started_at)
            insert_ignore(
                connection,
                GATE_CALLS,
                {
                    "campaign_id": cid,
                    "round_index": index,
                    "call_index": call_index,
                    "name": gate,
                    "budget": budget,
                    "attempts_used": 0,
                    "disposition": "pending",
                    "fallback_hash": fallback_hash,
                    "fallback_value": fallback_json,
                    "fallback_computed_at": now(),
                },
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

        return self._write(work)

    def record_attempt(self, gate_call_id: int, attempt: Any) -> None:
        """Record one ``acceptance.Attempt`` (or its ``model_dump``) with its verdicts."""
        self.record_attempts(gate_call_id, [attempt])

    def record_attempts(self, gate_call_id: int, attempts: Iterable[Any]) -> None:
        """Record many attempts of one gate call in one transaction (bulk loads).

        An attempt already recorded stands (a replay records nothing twice), except
        one whose check failed (``failed_by``): a rerun checks its value again, and
        what that check said replaces the failure.
        """
        rows = [_attempt_values(gate_call_id, a) for a in attempts]
        try:
            self._write(lambda connection: _insert_attempts(connection, gate_call_id, rows))
        except IntegrityError:
            raise NotFound(
                f"no gate call with id {gate_call_id}", details={"gate_call_id": gate_call_id}
            ) from None

    def finish_gate_call(
        self,
        gate_call_id: int,
        disposition: str,
        attempts_used: int,
        *,
        attempts: Iterable[Any] = (),
    ) -> None:
        """Record how the gate call ended and how many attempts it used.

        ``attempts`` not recorded yet are recorded in the same transaction (as
        :meth:`record_attempts` does): the call's end and its attempts land together.
        """
        end = GateCallEnd(gate_call_id, disposition, attempts_used, tuple(attempts))
        rows = _end_rows(end)
        self._write(lambda connection: _finish_call(connection, end, rows))

    def record_decision(
        self,
        name: str,
        index: int,
        seq: int,
        record: Mapping[str, Any],
        *,
        gate_call: GateCallEnd | None = None,
        call_index: int | None = None,
        fates: Iterable[CandidateFateRecord] = (),
    ) -> None:
        """Record the policy decision ``seq`` of a round (``Decision.to_record()``).

        Known keys fill their columns; any other key is kept in ``extra``. With
        ``gate_call``, the end of the call decided on (as :meth:`finish_gate_call`)
        and with ``fates``, what became of gate call ``call_index``'s candidates
        (as :meth:`record_candidate_fates`) land in the same transaction: the
        decision is one commit, not three.
        """
        if not record.get("outcome"):
            raise ValidationFailed("decision record needs an outcome", details={"field": "outcome"})
        data = jsonable(dict(record))
        values = {k: data.get(k) for k in _DECISION_FIELDS}
        extra = {k: v for k, v in data.items() if k not in _DECISION_FIELDS}
        fate_rows = _fate_rows(index, call_index, fates)
        end_rows = _end_rows(gate_call) if gate_call is not None else []

        def work(connection: Connection) -> None:
            if gate_call is not None:
                _finish_call(connection, gate_call, end_rows)
            cid = self._id(connection, name)
            self._ensure_round(connection, cid, index)
            insert_ignore(
                connection,
                DECISIONS,
                {
                    "campaign_id": cid,
                    "round_index": index,
                    "seq": seq,
                    **values,
                    "extra": extra or None,
                    "recorded_at": now(),
                },
                ("campaign_id", "round_index", "seq"),
            )
            _insert_fates(connection, cid, fate_rows)

        self._write(work)

    def record_candidate_fates(
        self, name: str, index: int, call_index: int, fates: Iterable[CandidateFateRecord]
    ) -> None:
        """Record what became of candidates of gate call ``call_index``, in one transaction.

        Insert-or-ignore on (round, call, source, candidate index): the first fate
        recorded for a candidate stands, so a replay, which derives the same fates,
        records nothing twice.
        """
        rows = _fate_rows(index, call_index, fates)
        if not rows:
            return

        def work(connection: Connection) -> None:
            cid = self._id(connection, name)
            self._ensure_round(connection, cid, index)
            _insert_fates(connection, cid, rows)

        self._write(work)


def _end_rows(end: GateCallEnd) -> list[dict[str, Any]]:
    """Return the attempt rows of a gate call's end, its disposition checked."""
    check_choice(end.disposition, DISPOSITIONS, "disposition")
    return [_attempt_values(end.gate_call_id, a) for a in end.attempts]


def _finish_call(connection: Connection, end: GateCallEnd, rows: list[dict[str, Any]]) -> None:
    """Set a gate call's disposition and attempts used; insert its attempts not recorded."""
    result = connection.execute(
        update(GATE_CALLS).where(GATE_CALLS.c.id == end.gate_call_id),
        {"disposition": end.disposition, "attempts_used": end.attempts_used},
    )
    if result.rowcount == 0:
        raise NotFound(
            f"no gate call with id {end.gate_call_id}",
            details={"gate_call_id": end.gate_call_id},
        )
    _insert_attempts(connection, end.gate_call_id, rows)


def _fate_rows(
    index: int, call_index: int | None, fates: Iterable[CandidateFateRecord]
) -> list[dict[str, Any]]:
    """Return candidate-fate rows of gate call ``call_index``, each fate and source checked."""
    rows = []
    for fate in fates:
        if call_index is None:
            raise ValidationFailed(
                "candidate fates need the gate call's index", details={"field": "call_index"}
            )
        check_choice(fate.fate, CANDIDATE_FATES, "fate")
        check_choice(fate.source, CANDIDATE_SOURCES, "source")
        rows.append(
            {
                "round_index": index,
                "call_index": call_index,
                "source": fate.source,
                "candidate_index": fate.index,
                "candidate": [float(v) for v in fate.candidate],
                "fate": fate.fate,
                "rule": fate.rule,
                "actor": fate.actor,
                "reason": fate.reason,
            }
        )
    return rows


def _insert_fates(connection: Connection, campaign: int, rows: list[dict[str, Any]]) -> None:
    """Insert fate rows; the first fate recorded for a candidate stands."""
    if not rows:
        return
    stamp = now()
    insert_ignore(
        connection,
        FATES,
        [{**row, "campaign_id": campaign, "recorded_at": stamp} for row in rows],
        ("campaign_id", "round_index", "call_index", "source", "candidate_index"),
    )


def _insert_attempts(connection: Connection, gate_call_id: int, rows: list[dict[str, Any]]) -> None:
    """Insert attempt rows; one whose check failed is replaced, any other recorded one stands."""
    numbers = [row["number"] for row in rows]
    if numbers:
        connection.execute(
            delete(ATTEMPTS).where(
                ATTEMPTS.c.gate_call_id == gate_call_id,
                ATTEMPTS.c.number.in_(numbers),
                ATTEMPTS.c.failed_by.is_not(None),
            )
        )
    insert_ignore(connection, ATTEMPTS, rows, ("gate_call_id", "number"))
