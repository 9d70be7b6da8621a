"""Read the provenance record back: checkpoints, summaries, one round in full.

Readers take an open connection and return frozen rows or JSON-ready dicts.
The campaign summary reads only the small tables (rounds, gate calls, batches)
plus indexed aggregates, so it stays fast on databases with millions of attempts.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, case, func, select

from flows._provenance._rows import (
    ApprovalEventRecord,
    ApprovalRow,
    Checkpoint,
    TaskResultRecord,
    as_dict,
    utc,
)
from flows._provenance._schema import (
    Approval,
    ApprovalEvent,
    AttemptRow,
    Batch,
    Campaign,
    GateCall,
    PolicyDecision,
    Round,
    TaskResultRow,
    table,
)
from flows._provenance._writes import campaign_id
from policies import NotFound

CAMPAIGNS: Table = table(Campaign)
ROUNDS: Table = table(Round)
GATE_CALLS: Table = table(GateCall)
ATTEMPTS: Table = table(AttemptRow)
DECISIONS: Table = table(PolicyDecision)
APPROVALS: Table = table(Approval)
APPROVAL_EVENTS: Table = table(ApprovalEvent)
BATCHES: Table = table(Batch)
TASK_RESULTS: Table = table(TaskResultRow)


def plain(row: Any, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return a result row as a dict, without ``drop``, with datetimes as ISO text."""
    return {k: as_dict(v) for k, v in row._mapping.items() if k not in drop}


def require_campaign(connection: Connection, name: str) -> int:
    """Return campaign ``name``'s id or raise :class:`NotFound`."""
    found = campaign_id(connection, name)
    if found is None:
        raise NotFound(f"no campaign named {name!r}", details={"campaign": name})
    return found


def checkpoint(connection: Connection, name: str) -> Checkpoint:
    """Return campaign ``name``'s checkpoint (an empty one for an unknown campaign)."""
    cid = campaign_id(connection, name)
    if cid is None:
        return Checkpoint(None, None, None, None, {})
    rows = connection.execute(
        select(ROUNDS.c.round_index, ROUNDS.c.status)
        .where(ROUNDS.c.campaign_id == cid)
        .order_by(ROUNDS.c.round_index)
    ).all()
    statuses = {int(r.round_index): str(r.status) for r in rows}
    completed = [i for i, s in statuses.items() if s == "completed"]
    if not completed:
        return Checkpoint(None, None, None, None, statuses)
    last = max(completed)
    states = connection.execute(
        select(ROUNDS.c.surrogate_state, ROUNDS.c.policy_state, ROUNDS.c.planner_state).where(
            ROUNDS.c.campaign_id == cid, ROUNDS.c.round_index == last
        )
    ).one()
    return Checkpoint(
        last, states.surrogate_state, states.policy_state, states.planner_state, statuses
    )


def approval(connection: Connection, key: str) -> ApprovalRow | None:
    """Return approval ``key`` with every event, or None."""
    row = connection.execute(
        select(APPROVALS, CAMPAIGNS.c.name.label("campaign"))
        .join(CAMPAIGNS, CAMPAIGNS.c.id == APPROVALS.c.campaign_id)
        .where(APPROVALS.c.key == key)
    ).one_or_none()
    if row is None:
        return None
    events = connection.execute(
        select(APPROVAL_EVENTS)
        .where(APPROVAL_EVENTS.c.approval_id == row.id)
        .order_by(APPROVAL_EVENTS.c.id)
    ).all()
    return ApprovalRow(
        key=row.key,
        campaign=row.campaign,
        round_index=row.round_index,
        rule=row.rule,
        approvers_allowed=list(row.approvers_allowed),
        requested_at=utc(row.requested_at),  # type: ignore[arg-type]  # not null
        description=row.description,
        flow_run_id=row.flow_run_id,
        decided_by=row.decided_by,
        decision=row.decision,
        comment=row.comment,
        overrides=row.overrides,
        decided_at=utc(row.decided_at),
        events=tuple(
            ApprovalEventRecord(
                decided_by=e.decided_by,
                decision=e.decision,
                comment=e.comment,
                overrides=e.overrides,
                allowed=bool(e.allowed),
                settled=bool(e.settled),
                recorded_at=utc(e.recorded_at),  # type: ignore[arg-type]  # not null
            )
            for e in events
        ),
    )


def task_records(connection: Connection, batch_id: int) -> list[TaskResultRecord]:
    rows = connection.execute(
        select(TASK_RESULTS)
        .where(TASK_RESULTS.c.batch_id == batch_id)
        .order_by(TASK_RESULTS.c.task_index)
    ).all()
    return [
        TaskResultRecord(
            index=r.task_index,
            key=r.key,
            status=r.status,
            value=r.value,
            runtime=r.runtime,
            host=r.host,
            exit_code=r.exit_code,
            stderr_tail=r.stderr_tail,
            attempts=r.attempts,
            error_code=r.error_code,
            retries=r.retries,
            candidate=r.candidate,
        )
        for r in rows
    ]


def finished_batch(connection: Connection, key: str) -> list[TaskResultRecord] | None:
    """Return batch ``key``'s results if it finished, else None."""
    batch = connection.execute(
        select(BATCHES.c.id, BATCHES.c.status).where(BATCHES.c.key == key)
    ).one_or_none()
    if batch is None or batch.status != "finished":
        return None
    return task_records(connection, batch.id)


def campaigns(connection: Connection) -> list[dict[str, Any]]:
    """Return one line per campaign, by name."""
    rounds = (
        select(ROUNDS.c.campaign_id, func.count().label("rounds"))
        .group_by(ROUNDS.c.campaign_id)
        .subquery()
    )
    rows = connection.execute(
        select(
            CAMPAIGNS.c.name,
            CAMPAIGNS.c.status,
            CAMPAIGNS.c.error_code,
            CAMPAIGNS.c.site,
            func.coalesce(rounds.c.rounds, 0).label("rounds"),
            CAMPAIGNS.c.created_at,
            CAMPAIGNS.c.updated_at,
        )
        .outerjoin(rounds, rounds.c.campaign_id == CAMPAIGNS.c.id)
        .order_by(CAMPAIGNS.c.name)
    ).all()
    return [plain(r) for r in rows]


def gate_calls(connection: Connection, cid: int, index: int) -> list[dict[str, Any]]:
    """Return one round's gate calls by call index."""
    rows = connection.execute(
        select(GATE_CALLS)
        .where(GATE_CALLS.c.campaign_id == cid, GATE_CALLS.c.round_index == index)
        .order_by(GATE_CALLS.c.call_index)
    ).all()
    return [plain(r, drop=("campaign_id",)) for r in rows]


def attempts(connection: Connection, gate_call_id: int) -> list[dict[str, Any]]:
    """Return a gate call's attempts by number."""
    rows = connection.execute(
        select(ATTEMPTS).where(ATTEMPTS.c.gate_call_id == gate_call_id).order_by(ATTEMPTS.c.number)
    ).all()
    return [plain(r, drop=("id", "gate_call_id")) for r in rows]


def decisions(connection: Connection, cid: int, index: int) -> list[dict[str, Any]]:
    """Return one round's policy decisions by seq."""
    rows = connection.execute(
        select(DECISIONS)
        .where(DECISIONS.c.campaign_id == cid, DECISIONS.c.round_index == index)
        .order_by(DECISIONS.c.seq)
    ).all()
    return [plain(r, drop=("id", "campaign_id", "round_index")) for r in rows]


def _round_counts(connection: Connection, cid: int) -> dict[int, dict[str, Any]]:
    gc = GATE_CALLS.c
    per_round: dict[int, dict[str, Any]] = {}
    rows = connection.execute(
        select(
            gc.round_index,
            gc.disposition,
            func.count().label("n"),
            func.sum(gc.attempts_used).label("used"),
        )
        .where(gc.campaign_id == cid)
        .group_by(gc.round_index, gc.disposition)
    ).all()
    for r in rows:
        entry = per_round.setdefault(int(r.round_index), {"dispositions": {}, "attempts": 0})
        entry["dispositions"][r.disposition] = int(r.n)
        if r.disposition != "pending":
            entry["attempts"] += int(r.used or 0)
    # Pending gate calls have not counted their attempts yet: count their rows. The
    # few pending ids are fetched first so the count is an index range scan per call,
    # whatever the planner's statistics say about a freshly loaded attempt table.
    pending = dict(
        connection.execute(
            select(gc.id, gc.round_index).where(gc.campaign_id == cid, gc.disposition == "pending")
        ).all()
    )
    if pending:
        counts = connection.execute(
            select(ATTEMPTS.c.gate_call_id, func.count().label("n"))
            .where(ATTEMPTS.c.gate_call_id.in_(list(pending)))
            .group_by(ATTEMPTS.c.gate_call_id)
        ).all()
        for r in counts:
            index = int(pending[r.gate_call_id])
            per_round.setdefault(index, {"dispositions": {}, "attempts": 0})
            per_round[index]["attempts"] += int(r.n)
    return per_round


def _best_result(connection: Connection, cid: int) -> dict[str, Any] | None:
    tr, b = TASK_RESULTS.c, BATCHES.c
    row = connection.execute(
        select(
            b.round_index,
            b.key.label("batch"),
            tr.task_index,
            tr.key,
            tr.objective,
            tr.value,
            tr.candidate,
        )
        .join(BATCHES, b.id == tr.batch_id)
        .where(b.campaign_id == cid, tr.status == "done", tr.objective.is_not(None))
        .order_by(tr.objective, b.round_index, tr.task_index)
        .limit(1)
    ).one_or_none()
    return None if row is None else plain(row)


def summary(connection: Connection, name: str) -> dict[str, Any]:
    """Return campaign ``name``'s summary: rounds, dispositions, approvals, best result."""
    cid = require_campaign(connection, name)
    campaign = plain(
        connection.execute(select(CAMPAIGNS).where(CAMPAIGNS.c.id == cid)).one(), drop=("id",)
    )
    counts = _round_counts(connection, cid)
    decided = {
        int(r.round_index): r.outcome
        for r in connection.execute(
            select(DECISIONS.c.round_index, DECISIONS.c.outcome, DECISIONS.c.seq)
            .where(DECISIONS.c.campaign_id == cid)
            .order_by(DECISIONS.c.seq)
        )
    }
    tr, b = TASK_RESULTS.c, BATCHES.c
    tasks = {
        int(r.round_index): {"tasks": int(r.n), "done": int(r.done or 0), "best": r.best}
        for r in connection.execute(
            select(
                b.round_index,
                func.count(tr.id).label("n"),
                func.sum(case((tr.status == "done", 1), else_=0)).label("done"),
                func.min(case((tr.status == "done", tr.objective), else_=None)).label("best"),
            )
            .join(TASK_RESULTS, tr.batch_id == b.id)
            .where(b.campaign_id == cid)
            .group_by(b.round_index)
        )
    }
    approvals = [
        plain(r)
        for r in connection.execute(
            select(
                APPROVALS.c.round_index,
                APPROVALS.c.key,
                APPROVALS.c.rule,
                APPROVALS.c.decision,
                APPROVALS.c.decided_by,
                APPROVALS.c.decided_at,
            )
            .where(APPROVALS.c.campaign_id == cid)
            .order_by(APPROVALS.c.round_index, APPROVALS.c.id)
        )
    ]
    rounds = []
    for r in connection.execute(
        select(ROUNDS.c.round_index, ROUNDS.c.status, ROUNDS.c.started_at, ROUNDS.c.finished_at)
        .where(ROUNDS.c.campaign_id == cid)
        .order_by(ROUNDS.c.round_index)
    ):
        index = int(r.round_index)
        entry = counts.get(index, {"dispositions": {}, "attempts": 0})
        rounds.append(
            {
                "index": index,
                "status": r.status,
                "started_at": as_dict(r.started_at),
                "finished_at": as_dict(r.finished_at),
                "gate_calls": sum(entry["dispositions"].values()),
                "dispositions": entry["dispositions"],
                "attempts": entry["attempts"],
                "decision": decided.get(index),
                **tasks.get(index, {"tasks": 0, "done": 0, "best": None}),
            }
        )
    totals: dict[str, int] = {}
    for entry in counts.values():
        for disposition, n in entry["dispositions"].items():
            totals[disposition] = totals.get(disposition, 0) + n
    finished = sum(n for d, n in totals.items() if d != "pending")
    attempts_total = sum(e["attempts"] for e in counts.values())
    return {
        "campaign": campaign,
        "rounds": rounds,
        "totals": {
            "rounds": len(rounds),
            "gate_calls": sum(totals.values()),
            "attempts": attempts_total,
            "dispositions": totals,
            # A gate stops at its first accepted attempt: one accepted attempt per accepted call.
            "acceptance_rate": (totals.get("accepted", 0) / finished) if finished else None,
            "attempt_acceptance_rate": (
                totals.get("accepted", 0) / attempts_total if attempts_total else None
            ),
            "fallbacks": totals.get("fallback", 0),
        },
        "approvals": approvals,
        "best_result": _best_result(connection, cid),
    }


def round_view(connection: Connection, name: str, index: int) -> dict[str, Any]:
    """Return one round in full: gate calls with attempts, decisions, approvals, batches."""
    cid = require_campaign(connection, name)
    row = connection.execute(
        select(ROUNDS).where(ROUNDS.c.campaign_id == cid, ROUNDS.c.round_index == index)
    ).one_or_none()
    if row is None:
        raise NotFound(
            f"campaign {name!r} has no round {index}", details={"campaign": name, "round": index}
        )
    calls = gate_calls(connection, cid, index)
    for call in calls:
        call["attempts"] = attempts(connection, call["id"])
    keys = (
        connection.execute(
            select(APPROVALS.c.key)
            .where(APPROVALS.c.campaign_id == cid, APPROVALS.c.round_index == index)
            .order_by(APPROVALS.c.id)
        )
        .scalars()
        .all()
    )
    batches = []
    for batch in connection.execute(
        select(BATCHES)
        .where(BATCHES.c.campaign_id == cid, BATCHES.c.round_index == index)
        .order_by(BATCHES.c.id)
    ):
        entry = plain(batch, drop=("id", "campaign_id", "round_index"))
        entry["results"] = as_dict(task_records(connection, batch.id))
        batches.append(entry)
    return {
        "campaign": name,
        "round": plain(row, drop=("id", "campaign_id")),
        "gate_calls": calls,
        "decisions": decisions(connection, cid, index),
        "approvals": [as_dict(approval(connection, k)) for k in keys],
        "batches": batches,
    }
