"""The report's approvals: who answered each request, when, and which candidates ran.

:func:`approvals` reads each request with every answer from the provenance store;
:func:`approval_answer` says in one line what settled a request, for example
``3 of 8 candidates (#0, #2, #5) approved by alice at 2026-12-03 10:15:00 UTC``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from flows._provenance import ProvenanceStore
from flows._provenance import _readers as readers
from flows._provenance._rows import ApprovalEventRecord
from flows._provenance._sql import Reader

REQUEST_COLUMNS = ("round", "rule", "requested", "answer", "comment", "wait (s)", "refused answers")
ANSWER_COLUMNS = ("round", "at", "by", "answer", "counted", "comment")


def seconds_between(start: str | None, end: str | None) -> float | None:
    """Return the seconds from ISO time ``start`` to ``end`` (None when one is missing)."""
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _moment(value: datetime | None) -> str | None:
    """Return ``value`` as ISO text in UTC (a naive time is taken as UTC)."""
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def _refusal(event: ApprovalEventRecord) -> str | None:
    """Return why an answer was not counted, in words, or None when it was."""
    if event.allowed:
        return None
    if event.refusal:
        return event.refusal
    if event.proof and event.proof != "totp ok":
        return event.proof
    return "not among the approvers"


def _on_form(reader: Reader, cid: int, index: int) -> int | None:
    """Return how many candidates an approval of round ``index`` was asked about.

    They are the round's last gate call's candidates that no rule refused: the
    approver's answer launched or struck them (or skipped them all, on a
    rejection). None when no fate is recorded (a pending request, an older store).
    """
    fates = readers.candidate_fates(reader, cid, index)
    if not fates:
        return None
    last = max(f["call_index"] for f in fates)
    return sum(1 for f in fates if f["call_index"] == last and f["fate"] != "refused")


def approvals(store: ProvenanceStore, cid: int, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Return each approval request: who decided what and when, which candidates, the wait.

    ``candidates`` is the number of candidates the request asked about;
    ``picked`` the ``#`` numbers (as in the form's table) an approver kept, when
    they approved only part of the batch; ``answers`` every answer in order,
    with ``refused`` saying why one was not counted.
    """
    rows = []
    for entry in summary["approvals"]:
        with store.reading() as reader:
            row = readers.approval(reader, entry["key"])
            if row is None:
                continue
            on_form = _on_form(reader, cid, row.round_index)
        overrides = row.overrides if isinstance(row.overrides, dict) else {}
        picked: list[int] | None = None
        if row.decision == "approved" and overrides.get("candidates"):
            picked = sorted(int(i) for i in overrides["candidates"])
        elif row.decision == "approved" and overrides.get("batch_size"):
            kept = int(overrides["batch_size"])
            picked = list(range(kept if on_form is None else min(kept, on_form)))
        requested, decided = _moment(row.requested_at), _moment(row.decided_at)
        rows.append(
            {
                "round_index": row.round_index,
                "key": row.key,
                "rule": row.rule,
                "approvers_allowed": list(row.approvers_allowed),
                "requested_at": requested,
                "decided_at": decided,
                "wait_seconds": seconds_between(requested, decided),
                "decided_by": row.decided_by,
                "decision": row.decision or "pending",
                "comment": row.comment,
                "candidates": on_form,
                "picked": picked,
                "refused_answers": sum(1 for e in row.events if not e.allowed),
                "answers": [
                    {
                        "at": _moment(e.recorded_at),
                        "by": e.decided_by,
                        "decision": e.decision,
                        "refused": _refusal(e),
                        "comment": e.comment,
                    }
                    for e in row.events
                ],
            }
        )
    return rows


def _when(iso: str | None) -> str:
    """Return an ISO time as ``YYYY-MM-DD HH:MM:SS UTC``."""
    if iso is None:
        return "-"
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _numbers(picked: Sequence[int]) -> str:
    return ", ".join(f"#{i}" for i in picked)


def approval_answer(approval: dict[str, Any]) -> str:
    """Return what settled an approval request, in one line.

    For example ``3 of 8 candidates (#0, #2, #5) approved by alice at 2026-12-03
    10:15:00 UTC`` or ``rejected by bob at ...: 8 candidates not run``.
    """
    decision, by, at = approval["decision"], approval["decided_by"], _when(approval["decided_at"])
    total, picked = approval["candidates"], approval["picked"]
    of = "" if total is None else f" of {total}"
    if decision == "approved":
        if picked is not None:
            what = f"{len(picked)}{of} candidates ({_numbers(picked)})"
        else:
            what = "the whole batch" if total is None else f"all {total} candidates"
        return f"{what} approved by {by} at {at}"
    if decision == "rejected":
        skipped = "" if total is None else f": {total} candidates not run"
        return f"rejected by {by} at {at}{skipped}"
    if decision == "timeout":
        return f"no allowed answer before the deadline (timed out at {at})"
    return f"pending since {_when(approval['requested_at'])}"


def request_row(approval: dict[str, Any]) -> tuple[Any, ...]:
    """Return a request's row of the report's approvals table (``REQUEST_COLUMNS``)."""
    return (
        approval["round_index"],
        approval["rule"],
        _when(approval["requested_at"]),
        approval_answer(approval),
        approval["comment"] or None,
        approval["wait_seconds"],
        approval["refused_answers"],
    )


def answer_rows(approval: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Return a request's answers as rows of the every-answer table (``ANSWER_COLUMNS``)."""
    return [
        (
            approval["round_index"],
            _when(e["at"]),
            e["by"],
            e["decision"],
            "yes" if e["refused"] is None else f"no: {e['refused']}",
            e["comment"] or None,
        )
        for e in approval["answers"]
    ]
