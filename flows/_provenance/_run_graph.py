"""The campaign as one graph of agents, inputs and actions, read in a single streamed pass.

``unattended export --format ro-crate`` and ``--format prov`` write the same graph
(:mod:`flows._crate`, :mod:`flows._provenance._prov`); this module reads
it from the provenance database alone and yields it item by item, so a campaign of
a million attempts never sits in memory: attempts are streamed, and everything else
is read a round, a batch or an approval at a time.

Items, in the order they come:

* :class:`Campaign` (one), then each pinned :class:`Input` and each :class:`Agent`;
* :class:`Action` for every round, gate call, attempt (with its :class:`Value`, the
  proposal), verifier run and verifier task, policy decision, approval and approval
  event, and simulation task (with its candidate and result);
* :class:`Job` for every scheduler job (allocation) a task or verifier task ran in.

Ids are local and stable (``round/0/call/1/attempt/2``: no ``-``, which PROV-N
would make ``prov`` escape character by character): an action names its
``parent`` and the values it ``used`` or ``generated`` by id, so an item never waits
for another. Nothing secret is read: the spec's notify URLs are masked again (a
campaign recorded before they were masked at load time still has them), the site
config and the other inputs are known by their pinned hash and path only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from flows._masking import notify_secrets_masked
from flows._provenance import _queries as sql
from flows._provenance._readers import allocations, approval, require_campaign, task_records
from flows._provenance._sql import Reader, columns

# The graph's own reads (the export's are in ``_queries``); plain SQL on both drivers.
GATE_CALLS: Final = (
    "SELECT round_index, call_index, name, budget, attempts_used, disposition, fallback_hash, "
    "fallback_computed_at FROM gate_call WHERE campaign_id = :cid "
    "ORDER BY round_index, call_index"
)
PINNED: Final = (
    f"SELECT {columns('input_pin', drop=('id', 'campaign_id'))} FROM input_pin "  # noqa: S608 - constant column map
    "WHERE campaign_id = :cid AND revision = "
    "(SELECT max(revision) FROM input_pin WHERE campaign_id = :cid) ORDER BY name"
)
DECIDERS: Final = (
    "SELECT DISTINCT e.decided_by FROM approval_event e JOIN approval a ON a.id = e.approval_id "
    "WHERE a.campaign_id = :cid"
)
ROUNDS: Final = (
    "SELECT round_index, status, started_at, finished_at FROM round "
    "WHERE campaign_id = :cid ORDER BY round_index"
)

# Action kinds, in the order the workflow lists its steps.
KINDS: Final = (
    "round",
    "gate_call",
    "attempt",
    "verifier_run",
    "verifier_task",
    "decision",
    "approval",
    "approval_event",
    "simulation_task",
)
# The agent (and tool) that carries out each kind of action.
TOOL_OF: Final = {
    "round": "engine",
    "gate_call": "gate",
    "attempt": "planner",
    "verifier_run": "verifier",
    "verifier_task": "verifier",
    "decision": "policy",
    "approval": "approval",
    "approval_event": "approval",
    "simulation_task": "simulation",
}
STATUSES: Final = ("completed", "failed", "active")


@dataclass(frozen=True)
class Campaign:
    """The campaign row: its masked spec, site, seed, code version and status."""

    name: str
    spec: dict[str, Any]
    site: str
    seed: int
    code_version: str
    status: str
    error_code: str | None
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class Input:
    """One pinned input (spec, policy, transcript, site, simulation): its file and sha256."""

    name: str
    file: str | None
    sha256: str
    revision: int


@dataclass(frozen=True)
class Agent:
    """Who acts: a ``person`` (an approver) or ``software`` (planner, policy, verifier...)."""

    id: str
    kind: str
    name: str


@dataclass(frozen=True)
class Value:
    """A value an action used or generated: a proposal, a candidate, a result, an outcome."""

    id: str
    name: str
    value: Any

    def text(self) -> str:
        """Return the value as compact JSON text (a string stays itself)."""
        if isinstance(self.value, str):
            return self.value
        return json.dumps(self.value, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Action:
    """One thing that happened: ``kind`` is one of :data:`KINDS`.

    ``status`` is ``completed``, ``failed`` or ``active``; ``values`` are the values
    this action introduces (written with it); ``used`` and ``generated`` name values
    by id, which may belong to another action (a verifier run uses its attempt's
    proposal). ``host`` and ``job`` say where a task ran.
    """

    id: str
    kind: str
    name: str
    status: str
    start: str | None = None
    end: str | None = None
    parent: str | None = None
    agent: str | None = None
    participants: tuple[str, ...] = ()
    values: tuple[Value, ...] = ()
    used: tuple[str, ...] = ()
    generated: tuple[str, ...] = ()
    error: str | None = None
    description: str | None = None
    host: str | None = None
    job: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """A scheduler job (allocation) tasks ran in, as recorded."""

    job_id: str
    request: int | None
    state: str | None
    nodes: tuple[str, ...]
    requested_at: str | None
    started_at: str | None
    ends_at: str | None
    ended_at: str | None
    end_reason: str | None


Item = Campaign | Input | Agent | Action | Job


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def person_id(name: str) -> str:
    """Return the agent id of approver ``name``."""
    return f"person/{name}"


def masked_spec(spec: Any) -> dict[str, Any]:
    """Return the recorded spec with its notify URLs masked (older records kept them)."""
    return notify_secrets_masked(spec) if isinstance(spec, dict) else {}


def campaign_graph(reader: Reader, name: str) -> Iterator[Item]:
    """Yield campaign ``name``'s graph (see the module doc); raises NotFound first."""
    cid = require_campaign(reader, name)
    row = reader.first(sql.CAMPAIGN, cid=cid)
    assert row is not None  # the id was just read
    spec = masked_spec(row["spec"])
    yield Campaign(
        name=row["name"],
        spec=spec,
        site=row["site"],
        seed=row["seed"],
        code_version=row["code_version"],
        status=row["status"],
        error_code=row["error_code"],
        created_at=_iso(row["created_at"]) or "",
        updated_at=_iso(row["updated_at"]) or "",
    )
    for pin in reader.all(PINNED, cid=cid):
        yield Input(pin["name"], pin["file"], pin["sha256"], pin["revision"])
    yield from _agents(reader, cid, spec)
    yield from _rounds(reader, cid)
    yield from _attempts(reader, cid)
    yield from _decisions(reader, cid)
    for key in reader.scalars(sql.EXPORT_APPROVAL_KEYS, cid=cid):
        yield from _approval(reader, key)
    for batch in reader.all(sql.EXPORT_BATCHES, cid=cid):
        yield from _tasks(reader, batch)
    for job in allocations(reader, cid):
        yield Job(
            job_id=str(job["job_id"]),
            request=job["request"],
            state=job["state"],
            nodes=tuple(job["nodes"] or ()),
            requested_at=job["requested_at"],
            started_at=job["started_at"],
            ends_at=job["ends_at"],
            ended_at=job["ended_at"],
            end_reason=job["end_reason"],
        )


def _agents(reader: Reader, cid: int, spec: dict[str, Any]) -> Iterator[Agent]:
    planner = spec.get("planner") if isinstance(spec.get("planner"), dict) else {}
    kind = planner.get("kind", "planner") if isinstance(planner, dict) else "planner"
    yield Agent("planner", "software", f"planner ({kind})")
    yield Agent("policy", "software", f"policy {spec.get('policy') or '(built-in)'}")
    people: set[str] = set()
    approvals = spec.get("approvals")
    if isinstance(approvals, dict):
        people.update(str(p) for p in approvals.get("approvers") or ())
    people.update(str(p) for p in reader.scalars(DECIDERS, cid=cid) if p)
    for key in reader.scalars(sql.EXPORT_APPROVAL_KEYS, cid=cid):
        found = approval(reader, key)
        if found is not None:
            people.update(found.approvers_allowed)
    for person in sorted(people):
        yield Agent(person_id(person), "person", person)


_ROUND_STATUS: Final = {"completed": "completed", "running": "active"}
_CALL_STATUS: Final = {"accepted": "completed", "fallback": "completed", "pending": "active"}
_TASK_STATUS: Final = {"done": "completed", "launched": "active"}
_DECISION_STATUS: Final = {None: "active"}


def _rounds(reader: Reader, cid: int) -> Iterator[Action]:
    for row in reader.all(ROUNDS, cid=cid):
        index = row["round_index"]
        yield Action(
            id=f"round/{index}",
            kind="round",
            name=f"round {index}",
            status=_ROUND_STATUS.get(row["status"], "failed"),
            start=_iso(row["started_at"]),
            end=_iso(row["finished_at"]),
            agent="engine",
            description=f"round {index}: {row['status']}",
        )
    for call in reader.all(GATE_CALLS, cid=cid):
        index, number = call["round_index"], call["call_index"]
        fallback = Value(
            f"round/{index}/call/{number}/fallback", "fallback sha256", call["fallback_hash"]
        )
        yield Action(
            id=f"round/{index}/call/{number}",
            kind="gate_call",
            name=f"gate call {number} of round {index} ({call['name']})",
            status=_CALL_STATUS.get(call["disposition"], "failed"),
            start=_iso(call["fallback_computed_at"]),
            parent=f"round/{index}",
            agent="gate",
            values=(fallback,),
            generated=(fallback.id,),
            description=(
                f"{call['disposition']} after {call['attempts_used']} of {call['budget']} attempts"
            ),
        )


def _attempts(reader: Reader, cid: int) -> Iterator[Action]:
    for row in reader.stream(sql.EXPORT_ATTEMPTS, cid=cid):
        call = f"round/{row['round_index']}/call/{row['call_index']}"
        own = f"{call}/attempt/{row['number']}"
        proposal = Value(f"{own}/proposal", "proposal", row["value"])
        refused = row["failed_by"] or row["rejected_by"]
        yield Action(
            id=own,
            kind="attempt",
            name=f"attempt {row['number']} of call {row['call_index']}, round {row['round_index']}",
            status="failed" if refused else "completed",
            parent=call,
            agent="planner",
            values=(proposal,),
            generated=(proposal.id,),
            error=f"{refused}: {row['reason']}" if refused else None,
            description=(
                f"failed by {row['failed_by']}"
                if row["failed_by"]
                else f"rejected by {row['rejected_by']}"
                if row["rejected_by"]
                else "accepted"
            ),
            properties={"duration": row["duration"]},
        )
        for verdict in row["verdicts"] or ():
            if isinstance(verdict, dict) and verdict.get("check") == "verifier":
                yield from _verifier(own, proposal.id, verdict)


def _verifier(attempt: str, proposal: str, verdict: dict[str, Any]) -> Iterator[Action]:
    run = f"{attempt}/verifier"
    yield Action(
        id=run,
        kind="verifier_run",
        name=f"verifier run of {attempt}",
        status="completed" if verdict.get("passed") else "failed",
        parent=attempt,
        agent="verifier",
        used=(proposal,),
        error=None if verdict.get("passed") else str(verdict.get("reason") or "rejected"),
        properties={"duration": verdict.get("duration")},
    )
    details = verdict.get("details") if isinstance(verdict.get("details"), dict) else {}
    for task in (details or {}).get("tasks") or ():
        if not isinstance(task, dict):
            continue
        status = task.get("status")
        yield Action(
            id=f"{run}/task/{task.get('index')}",
            kind="verifier_task",
            name=f"verifier task {task.get('key')}",
            status=_TASK_STATUS.get(str(status), "failed"),
            parent=run,
            agent="verifier",
            host=task.get("host"),
            job=None if task.get("job_id") is None else str(task.get("job_id")),
            description=f"{status}, {task.get('attempts')} attempt(s)",
            properties={"duration": task.get("runtime"), "identifier": task.get("key")},
        )


def _decisions(reader: Reader, cid: int) -> Iterator[Action]:
    for row in reader.all(sql.EXPORT_DECISIONS, cid=cid):
        own = f"round/{row['round_index']}/decision/{row['seq']}"
        outcome = Value(f"{own}/outcome", "outcome", row["outcome"])
        fired = ", ".join(str(rule) for rule in row["rules_fired"] or ())
        reason = " ".join(x for x in (row["code"] or "", row["reason"] or "") if x)
        yield Action(
            id=own,
            kind="decision",
            name=f"policy decision {row['seq']} of round {row['round_index']}: {row['outcome']}",
            status="completed",
            end=_iso(row["recorded_at"]),
            parent=f"round/{row['round_index']}",
            agent="policy",
            values=(outcome,),
            generated=(outcome.id,),
            description=f"{reason or row['outcome']}" + (f" (rules: {fired})" if fired else ""),
        )


def _approval(reader: Reader, key: str) -> Iterator[Action]:
    found = approval(reader, key)
    if found is None:
        return
    own = f"approval/{key}"
    decision = Value(f"{own}/decision", "decision", found.decision or "pending")
    yield Action(
        id=own,
        kind="approval",
        name=f"approval {key} (rule {found.rule}): {found.decision or 'pending'}",
        status="completed" if found.decision else "active",
        start=_iso(found.requested_at),
        end=_iso(found.decided_at),
        parent=f"round/{found.round_index}",
        agent=person_id(found.decided_by) if found.decided_by else None,
        participants=tuple(person_id(p) for p in found.approvers_allowed),
        values=(decision,),
        generated=(decision.id,),
        description=found.comment,
    )
    for number, event in enumerate(found.events):
        answer = Value(f"{own}/event/{number}/decision", "decision", event.decision)
        notes = [
            "allowed" if event.allowed else "not allowed",
            "settled the request" if event.settled else "did not settle the request",
        ]
        notes += [f"proof: {event.proof}"] if event.proof else []
        notes += [f"refused: {event.refusal}"] if event.refusal else []
        yield Action(
            id=f"{own}/event/{number}",
            kind="approval_event",
            name=f"answer of {event.decided_by} to {key}: {event.decision}",
            status="completed" if event.allowed else "failed",
            end=_iso(event.recorded_at),
            parent=own,
            agent=person_id(event.decided_by or "unknown"),
            values=(answer,),
            generated=(answer.id,),
            description="; ".join(notes),
        )


def _tasks(reader: Reader, batch: dict[str, Any]) -> Iterator[Action]:
    launched, finished = _iso(batch["launched_at"]), _iso(batch["finished_at"])
    for task in task_records(reader, batch["id"]):
        own = f"batch/{batch['key']}/task/{task.index}"
        candidate = Value(f"{own}/candidate", "candidate", task.candidate)
        result = Value(f"{own}/result", "result", task.value)
        failed = task.status != "done"
        yield Action(
            id=own,
            kind="simulation_task",
            name=f"simulation task {task.key}",
            status=_TASK_STATUS.get(task.status, "failed"),
            start=launched,
            end=finished,
            parent=f"round/{batch['round_index']}",
            agent="simulation",
            values=(candidate, result),
            used=(candidate.id,),
            generated=(result.id,),
            error=f"{task.status}: {task.error_code or ''}".rstrip(": ") if failed else None,
            host=task.host,
            job=None if task.job_id is None else str(task.job_id),
            description=(
                f"{task.status} after {task.attempts} attempt(s), exit code {task.exit_code}"
                + (f", relaunch {batch['relaunch']}" if batch["relaunch"] else "")
            ),
            properties={"duration": task.runtime, "identifier": task.key},
        )
