"""Read the provenance record back: checkpoints, summaries, one round in full.

Every query is SQL text with ``:named`` parameters, written once here and run by
a :class:`~flows._provenance._sql.Reader`: stdlib ``sqlite3`` on the CLI's read
path (no SQLAlchemy imported), the store's SQLAlchemy connection everywhere else
(the engine, reports, PostgreSQL). Readers return frozen rows or JSON-ready dicts.
The campaign summary reads only the small tables (rounds, gate calls, batches)
plus indexed aggregates, so it stays fast on databases with millions of attempts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

from flows._provenance import _queries as sql
from flows._provenance._locations import Location
from flows._provenance._rows import (
    ApprovalEventRecord,
    ApprovalRow,
    Checkpoint,
    LeaseRow,
    RunEnding,
    TaskResultRecord,
    as_dict,
    now,
    utc,
)
from flows._provenance._sql import Reader
from policies import NotFound


def plain(row: dict[str, Any], *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return a decoded row without ``drop``, with datetimes as ISO text."""
    return {k: as_dict(v) for k, v in row.items() if k not in drop}


def campaign_id(reader: Reader, name: str) -> int | None:
    """Return campaign ``name``'s id, or None."""
    found = reader.scalars(sql.CAMPAIGN_ID, name=name)
    return int(found[0]) if found else None


def lease(reader: Reader, name: str) -> LeaseRow | None:
    """Return who holds campaign ``name``'s lease (None: never taken, or no such campaign)."""
    cid = campaign_id(reader, name)
    row = None if cid is None else reader.first(sql.LEASE, cid=cid)
    if row is None:
        return None
    return LeaseRow(
        str(row["owner"]),
        str(row["token"]),
        str(row["host"]),
        int(row["pid"]),
        row["heartbeat_at"],
        row["expires_at"],
        bool(row["released"]),
    )


def run_endings(reader: Reader, name: str) -> dict[str, RunEnding]:
    """Return how each of campaign ``name``'s flow runs ended, by flow run id (recorded only)."""
    cid = campaign_id(reader, name)
    rows = [] if cid is None else reader.all(sql.RUN_ENDINGS, cid=cid)
    return {
        str(row["flow_run_id"]): RunEnding(
            str(row["flow_run_id"]),
            str(row["status"]),
            row["code"],
            utc(row["recorded_at"]) or now(),
        )
        for row in rows
    }


def batches_in_flight(reader: Reader, name: str) -> int:
    """Return how many of campaign ``name``'s batches were launched and not finished."""
    cid = campaign_id(reader, name)
    return 0 if cid is None else int(reader.scalars(sql.BATCHES_IN_FLIGHT, cid=cid)[0])


def require_campaign(reader: Reader, name: str) -> int:
    """Return campaign ``name``'s id or raise :class:`NotFound`."""
    found = campaign_id(reader, name)
    if found is None:
        raise NotFound(f"no campaign named {name!r}", details={"campaign": name})
    return found


def campaign_row(reader: Reader, cid: int) -> dict[str, Any]:
    """Return campaign ``cid``'s row (without its id), datetimes as ISO text."""
    row = reader.first(sql.CAMPAIGN, cid=cid)
    assert row is not None  # the id was just read
    return plain(row)


def checkpoint(reader: Reader, name: str) -> Checkpoint:
    """Return campaign ``name``'s checkpoint (an empty one for an unknown campaign)."""
    cid = campaign_id(reader, name)
    if cid is None:
        return Checkpoint(None, (), None, None, {})
    statuses = {
        int(r["round_index"]): str(r["status"]) for r in reader.all(sql.ROUND_STATUSES, cid=cid)
    }
    completed = [i for i, s in statuses.items() if s == "completed"]
    if not completed:
        return Checkpoint(None, (), None, None, statuses)
    last = max(completed)
    states = reader.first(sql.ROUND_STATES, cid=cid, index=last)
    assert states is not None  # the round was just read
    surrogate = reader.all(sql.SURROGATE_STATES, cid=cid, last=last)
    outcomes = reader.all(sql.DECISION_OUTCOMES, cid=cid, last=last)
    return Checkpoint(
        last,
        tuple(r["surrogate_state"] for r in surrogate if r["surrogate_state"] is not None),
        states["policy_state"],
        states["planner_state"],
        statuses,
        tuple(str(r["outcome"]) for r in outcomes),
    )


def approval(reader: Reader, key: str) -> ApprovalRow | None:
    """Return approval ``key`` with every event, or None."""
    row = reader.first(sql.APPROVAL, key=key)
    if row is None:
        return None
    events = reader.all(sql.APPROVAL_EVENTS, approval=row["id"])
    return ApprovalRow(
        key=row["key"],
        campaign=row["campaign"],
        round_index=row["round_index"],
        rule=row["rule"],
        approvers_allowed=list(row["approvers_allowed"]),
        requested_at=row["requested_at"],
        description=row["description"],
        allocation_start=row["allocation_start"],
        allocation_end=row["allocation_end"],
        flow_run_id=row["flow_run_id"],
        decided_by=row["decided_by"],
        decision=row["decision"],
        comment=row["comment"],
        overrides=row["overrides"],
        decided_at=row["decided_at"],
        require_proof=row["require_proof"],
        allow_override=row["allow_override"],
        events=tuple(
            ApprovalEventRecord(
                decided_by=e["decided_by"],
                decision=e["decision"],
                comment=e["comment"],
                overrides=e["overrides"],
                allowed=bool(e["allowed"]),
                settled=bool(e["settled"]),
                recorded_at=e["recorded_at"],
                event_key=e["event_key"],
                proof=e["proof"],
                refusal=e["refusal"],
            )
            for e in events
        ),
    )


def task_records(reader: Reader, batch_id: int) -> list[TaskResultRecord]:
    """Return a batch's task results, by index."""
    return [
        TaskResultRecord(
            index=r["task_index"],
            key=r["key"],
            status=r["status"],
            value=r["value"],
            runtime=r["runtime"],
            host=r["host"],
            exit_code=r["exit_code"],
            stderr_tail=r["stderr_tail"],
            attempts=r["attempts"],
            error_code=r["error_code"],
            retries=r["retries"],
            candidate=r["candidate"],
            job_id=r["job_id"],
            allocation_start=r["allocation_start"],
            allocation_end=r["allocation_end"],
        )
        for r in reader.all(sql.TASK_RESULTS, batch=batch_id)
    ]


def finished_batch(reader: Reader, key: str) -> list[TaskResultRecord] | None:
    """Return batch ``key``'s results if it finished, else None."""
    batch = reader.first(sql.BATCH_BY_KEY, key=key)
    if batch is None or batch["status"] != "finished":
        return None
    return task_records(reader, batch["id"])


def campaigns(reader: Reader) -> list[dict[str, Any]]:
    """Return one line per campaign, by name."""
    return [plain(r) for r in reader.all(sql.CAMPAIGNS)]


def gate_calls(reader: Reader, cid: int, index: int) -> list[dict[str, Any]]:
    """Return one round's gate calls by call index."""
    return [plain(r) for r in reader.all(sql.GATE_CALLS, cid=cid, index=index)]


def attempts(reader: Reader, gate_call_id: int) -> list[dict[str, Any]]:
    """Return a gate call's attempts by number."""
    return [plain(r) for r in reader.all(sql.ATTEMPTS, call=gate_call_id)]


def decisions(reader: Reader, cid: int, index: int) -> list[dict[str, Any]]:
    """Return one round's policy decisions by seq."""
    return [plain(r) for r in reader.all(sql.DECISIONS, cid=cid, index=index)]


def candidate_fates(reader: Reader, cid: int, index: int) -> list[dict[str, Any]]:
    """Return what became of each candidate of one round, by gate call, source and index."""
    return [plain(r) for r in reader.all(sql.FATES, cid=cid, index=index)]


def allocations(reader: Reader, cid: int) -> list[dict[str, Any]]:
    """Return campaign ``cid``'s allocation rows, oldest request first (times as ISO text)."""
    return [plain(r) for r in reader.all(sql.ALLOCATIONS, cid=cid)]


@dataclass(frozen=True)
class AllocationUsage:
    """What a campaign's recorded allocations used of its budget, over all its runs.

    ``requests`` counts the allocations requested (the jobs of one request share its
    number and request time); ``node_hours`` sums each started job's nodes x hours
    from its start to its end, or, for a job still open (its run crashed), to its
    planned end or ``at``, whichever is earlier.
    """

    requests: int = 0
    node_hours: float = 0.0


def _moment(text: str | None) -> datetime | None:
    return None if text is None else utc(datetime.fromisoformat(text))


def charged_node_hours(row: dict[str, Any], at: datetime) -> float:
    """Return the node-hours one allocation row is charged up to ``at`` (see AllocationUsage)."""
    start = _moment(row["started_at"])
    if start is None:
        return 0.0
    stop = _moment(row["ended_at"])
    if stop is None:
        planned = _moment(row["ends_at"])
        stop = at if planned is None else min(at, planned)
    nodes = max(int(row["node_count"] or 0), 1)
    return max(0.0, (stop - start).total_seconds()) * nodes / 3600.0


def allocation_usage(reader: Reader, cid: int, at: datetime) -> AllocationUsage:
    """Return what campaign ``cid``'s allocations used of its budget up to ``at``."""
    rows = allocations(reader, cid)
    requests = {(r["request"], r["requested_at"]) for r in rows}
    hours = sum((charged_node_hours(r, at) for r in rows), 0.0)
    return AllocationUsage(requests=len(requests), node_hours=hours)


@dataclass(frozen=True)
class Progress:
    """What a campaign has achieved: rounds completed and task results (not interrupted)."""

    rounds: int = 0
    tasks: int = 0


def progress(reader: Reader, cid: int) -> Progress:
    """Return campaign ``cid``'s progress (the watchdog's mark for continuations)."""
    row = reader.first(sql.PROGRESS, cid=cid)
    if row is None:
        return Progress()
    return Progress(rounds=int(row["rounds"] or 0), tasks=int(row["tasks"] or 0))


def _round_counts(reader: Reader, cid: int) -> dict[int, dict[str, Any]]:
    per_round: dict[int, dict[str, Any]] = {}
    for r in reader.all(sql.DISPOSITIONS, cid=cid):
        entry = per_round.setdefault(int(r["round_index"]), {"dispositions": {}, "attempts": 0})
        entry["dispositions"][r["disposition"]] = int(r["n"])
        if r["disposition"] != "pending":
            entry["attempts"] += int(r["used"] or 0)
    # Pending gate calls have not counted their attempts yet: count their rows, one
    # index range scan per pending call (there are few), whatever the planner's
    # statistics say about a freshly loaded attempt table.
    for call in reader.all(sql.PENDING_CALLS, cid=cid):
        index = int(call["round_index"])
        per_round.setdefault(index, {"dispositions": {}, "attempts": 0})
        per_round[index]["attempts"] += int(reader.scalars(sql.ATTEMPT_COUNT, call=call["id"])[0])
    return per_round


def summary(reader: Reader, name: str) -> dict[str, Any]:
    """Return campaign ``name``'s summary: rounds, dispositions, approvals, best result."""
    cid = require_campaign(reader, name)
    campaign = campaign_row(reader, cid)
    counts = _round_counts(reader, cid)
    decided = {int(r["round_index"]): r["outcome"] for r in reader.all(sql.OUTCOMES, cid=cid)}
    tasks = {
        int(r["round_index"]): {
            "tasks": int(r["n"] or 0),
            "done": int(r["done"] or 0),
            "best": r["best"],
            "interruptions": int(r["interrupted"] or 0),
        }
        for r in reader.all(sql.ROUND_TASKS, cid=cid)
    }
    approvals = [plain(r) for r in reader.all(sql.APPROVALS, cid=cid)]
    verdicts: dict[int, str] = {}
    for a in approvals:  # the round's last request decides what its suspend came to
        verdicts[int(a["round_index"])] = a["decision"] or "pending"
    rounds = []
    for r in reader.all(sql.ROUNDS, cid=cid):
        index = int(r["round_index"])
        entry = counts.get(index, {"dispositions": {}, "attempts": 0})
        rounds.append(
            {
                "index": index,
                "status": r["status"],
                "started_at": as_dict(r["started_at"]),
                "finished_at": as_dict(r["finished_at"]),
                "gate_calls": sum(entry["dispositions"].values()),
                "dispositions": entry["dispositions"],
                "attempts": entry["attempts"],
                "decision": _with_verdict(decided.get(index), verdicts.get(index)),
                **tasks.get(index, {"tasks": 0, "done": 0, "best": None, "interruptions": 0}),
            }
        )
    totals: dict[str, int] = {}
    for entry in counts.values():
        for disposition, n in entry["dispositions"].items():
            totals[disposition] = totals.get(disposition, 0) + n
    finished = sum(n for d, n in totals.items() if d != "pending")
    attempts_total = sum(e["attempts"] for e in counts.values())
    best = reader.first(sql.BEST_RESULT, cid=cid)
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
        "best_result": None if best is None else plain(best),
    }


def round_view(reader: Reader, name: str, index: int) -> dict[str, Any]:
    """Return one round in full: gate calls with attempts, decisions, approvals, batches."""
    cid = require_campaign(reader, name)
    row = reader.first(sql.ROUND, cid=cid, index=index)
    if row is None:
        raise NotFound(
            f"campaign {name!r} has no round {index}", details={"campaign": name, "round": index}
        )
    calls = gate_calls(reader, cid, index)
    for call in calls:
        call["attempts"] = attempts(reader, call["id"])
    keys = reader.scalars(sql.ROUND_APPROVAL_KEYS, cid=cid, index=index)
    batches = []
    for batch in reader.all(sql.ROUND_BATCHES, cid=cid, index=index):
        entry = plain(batch, drop=("id", "campaign_id", "round_index"))
        entry["results"] = as_dict(task_records(reader, batch["id"]))
        batches.append(entry)
    return {
        "campaign": name,
        "round": plain(row),
        "gate_calls": calls,
        "decisions": decisions(reader, cid, index),
        "approvals": [as_dict(approval(reader, k)) for k in keys],
        "batches": batches,
        "candidates": candidate_fates(reader, cid, index),
    }


def _with_verdict(outcome: str | None, verdict: str | None) -> str | None:
    """Return a round's last policy outcome, with the approval's verdict after a suspend."""
    if outcome == "suspend" and verdict is not None:
        return f"suspend: {verdict}"
    return outcome


class StoreReads:
    """The read methods every store has: the full store and the light SQLite reader.

    A subclass says how to get a :class:`Reader` (:meth:`reading`) and how to
    :meth:`close`; every method runs the same queries, within one read transaction.
    """

    location: Location

    def close(self) -> None:
        """Release the connection(s)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def reading(self) -> contextlib.AbstractContextManager[Reader]:
        """Return a context that yields a reader inside one read transaction."""
        raise NotImplementedError

    def campaigns(self) -> list[dict[str, Any]]:
        """Return every campaign's name, status, error code, site and round count."""
        with self.reading() as reader:
            return campaigns(reader)

    def run_endings(self, name: str) -> dict[str, RunEnding]:
        """Return how each of campaign ``name``'s flow runs ended (``run_ending``), by run id."""
        with self.reading() as reader:
            return run_endings(reader, name)

    def batches_in_flight(self, name: str) -> int:
        """Return how many of campaign ``name``'s batches were launched and not finished."""
        with self.reading() as reader:
            return batches_in_flight(reader, name)

    def summary(self, name: str) -> dict[str, Any]:
        """Return campaign ``name``'s summary (rounds, dispositions, approvals, best result)."""
        with self.reading() as reader:
            return summary(reader, name)

    def round_view(self, name: str, index: int) -> dict[str, Any]:
        """Return everything recorded for one round of campaign ``name``."""
        with self.reading() as reader:
            return round_view(reader, name, index)

    def gate_calls(self, name: str, index: int) -> list[dict[str, Any]]:
        """Return round ``index``'s gate calls, by call index (without attempts)."""
        with self.reading() as reader:
            return gate_calls(reader, require_campaign(reader, name), index)

    def attempts(self, gate_call_id: int) -> list[dict[str, Any]]:
        """Return a gate call's attempts, by number, with verdicts and scores."""
        with self.reading() as reader:
            return attempts(reader, gate_call_id)

    def decisions(self, name: str, index: int) -> list[dict[str, Any]]:
        """Return round ``index``'s policy decisions, by seq."""
        with self.reading() as reader:
            return decisions(reader, require_campaign(reader, name), index)

    def find_approval(self, key: str) -> ApprovalRow | None:
        """Return approval ``key`` (with every event), or None."""
        with self.reading() as reader:
            return approval(reader, key)

    def allocations(self, campaign: str) -> list[dict[str, Any]]:
        """Return the campaign's allocations, oldest request first (times as ISO text)."""
        with self.reading() as reader:
            return allocations(reader, require_campaign(reader, campaign))

    def allocation_usage(self, campaign: str, at: datetime | None = None) -> AllocationUsage:
        """Return what the campaign's runs used of its allocation budget (none if unknown)."""
        with self.reading() as reader:
            cid = campaign_id(reader, campaign)
            return AllocationUsage() if cid is None else allocation_usage(reader, cid, at or now())

    def progress(self, campaign: str) -> Progress:
        """Return the campaign's rounds completed and task results (none if unknown)."""
        with self.reading() as reader:
            cid = campaign_id(reader, campaign)
            return Progress() if cid is None else progress(reader, cid)
