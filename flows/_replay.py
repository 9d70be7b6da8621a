"""Replay a changed policy against a finished campaign's recorded rounds, running nothing.

Each recorded gate call is judged by the new policy (from an empty state) with the
engine's own judgement, ``flows._engine._round_context.judge_call``: its candidate
rules on each candidate (with the verifier's prediction recorded on the accepted
attempt), thinning and top-ups from the recorded fallback, then the round's rules
on the batch left, in the :class:`policies.RoundContext` that ``round_context``
builds live (the accepted batch or the recorded fallback; budget spent,
consecutive fallbacks and earlier decisions carried forward as ``_assimilate``
advances them, from the *new* policy's decisions; the failed tasks of the last
batch as the record counted them). Candidates the new policy refuses are named
on their step beside the ones the record refused. What the record
cannot tell (the node-hours cost, the walltime, a human's answer to a new ASK,
the planner's answer to a new Retry) is taken from a stated source or assumed
and said so in the result; ``docs/replay.md`` lists each choice. A new stop
means the later rounds would never have run: they are "not reached".

Over 500 lines: reading the record, the result types and the replayer that walks the
record with them are one reader, read together; ``flows`` holds at most twelve modules
at its top (``tests/project/test_architecture.py``), so a split makes this a package.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sqlalchemy import select

from flows._engine._candidates import candidate_predictions
from flows._engine._counters import Counters
from flows._engine._round_context import CallJudgement, RoundFacts, judge_call, round_context
from flows._provenance import ProvenanceStore
from flows._provenance import _readers as readers
from flows._provenance import _tables as tables
from flows._provenance._sql import AlchemyReader
from flows._spec import CampaignSpec, spec_from_dict
from policies import Policy, RoundContext

NOT_REACHED = "not reached"
NO_RECORD = "no record"
NOT_CALLED = "not called"
# The candidate rules refused every candidate: the round stops before any round rule.
ALL_REFUSED = "all refused"
STOPS = frozenset({"block", "escalate", ALL_REFUSED})


@dataclass(frozen=True)
class ReplayStep:
    """One recorded gate call judged again (or a round the new policy never reaches)."""

    round_index: int
    call_index: int | None
    disposition: str | None
    recorded: str | None
    recorded_rules: tuple[str, ...]
    new: str
    new_rules: tuple[str, ...] = ()
    new_reason: str = ""
    note: str = ""
    # Candidates refused by a candidate rule, as ``<source> <index> (<rule>)``.
    recorded_refused: tuple[str, ...] = ()
    new_refused: tuple[str, ...] = ()

    @property
    def differs(self) -> bool:
        """Return whether the new policy's outcome, or the candidates it refuses, differ."""
        if self.new in (NOT_REACHED, NOT_CALLED, NO_RECORD):
            return self.new != (self.recorded or NO_RECORD)
        refused = sorted(self.new_refused) != sorted(self.recorded_refused)
        return refused or self.new != (self.recorded or NO_RECORD)


@dataclass
class ReplayResult:
    """Every step of a replay, how the campaign would have ended, and the assumptions."""

    campaign: str
    policy: str
    recorded_status: str
    new_status: str
    new_error_code: str | None
    node_hours_per_simulation: float
    node_hours_source: str
    can_suspend: bool
    steps: list[ReplayStep] = field(default_factory=list)
    stopped_round: int | None = None
    diverged_from: int | None = None

    def differences(self) -> dict[str, list[int]]:
        """Return the rounds where the outcomes differ, by what the new policy does."""
        found: dict[str, list[int]] = {
            "stopped": [],
            "asked": [],
            "retried": [],
            "continued": [],
            "refused": [],
            "not_reached": [],
        }
        names = {"block": "stopped", "escalate": "stopped", ALL_REFUSED: "stopped"}
        names |= {"suspend": "asked", "retry": "retried", "continue": "continued"}
        names |= {NOT_REACHED: "not_reached"}
        for step in self.steps:
            key = names.get(step.new)
            if step.new == (step.recorded or NO_RECORD) and step.differs:
                key = "refused"  # the same outcome on other candidates
            if step.differs and key and step.round_index not in found[key]:
                found[key].append(step.round_index)
        # A round the new policy stopped in is "stopped", though its later calls are not reached.
        judged = {i for kind, rounds in found.items() if kind != "not_reached" for i in rounds}
        found["not_reached"] = [i for i in found["not_reached"] if i not in judged]
        return found

    def to_dict(self) -> dict[str, Any]:
        """Return the replay as JSON-ready data."""
        data = asdict(self)
        for entry, step in zip(data["steps"], self.steps, strict=True):
            entry["differs"] = step.differs
        data["differences"] = self.differences()
        return data


def read_record(store: ProvenanceStore, name: str) -> dict[str, Any]:
    """Read what the replay needs: campaign row, rounds, gate calls, decisions, approvals."""
    c, r, g, a = (
        t.c for t in (tables.CAMPAIGNS, tables.ROUNDS, tables.GATE_CALLS, tables.ATTEMPTS)
    )
    b, d = tables.BATCHES.c, tables.DECISIONS.c
    with store.engine.connect() as connection:
        cid = readers.require_campaign(AlchemyReader(connection), name)
        campaign = connection.execute(select(c.spec, c.site, c.status).where(c.id == cid)).one()
        rounds = connection.execute(
            select(r.round_index, r.status, r.policy_state)
            .where(r.campaign_id == cid)
            .order_by(r.round_index)
        ).all()
        calls = connection.execute(
            select(g.id, g.round_index, g.call_index, g.disposition, g.fallback_value)
            .where(g.campaign_id == cid)
            .order_by(g.round_index, g.call_index)
        ).all()
        accepted = {
            int(row.gate_call_id): row
            for row in connection.execute(
                select(a.gate_call_id, a.value, a.scores, a.rejected_by)
                .join(tables.GATE_CALLS, g.id == a.gate_call_id)
                .where(g.campaign_id == cid, a.rejected_by.is_(None), a.failed_by.is_(None))
            )
        }
        decisions = connection.execute(
            select(d.round_index, d.seq, d.outcome, d.rules_fired, d.extra)
            .where(d.campaign_id == cid)
            .order_by(d.round_index, d.seq)
        ).all()
        batch_sizes: dict[int, int] = {}
        for row in connection.execute(
            select(b.round_index, b.candidates).where(b.campaign_id == cid).order_by(b.id)
        ):
            batch_sizes[int(row.round_index)] = len(row.candidates or [])
        keys = (
            connection.execute(
                select(tables.APPROVALS.c.key).where(tables.APPROVALS.c.campaign_id == cid)
            )
            .scalars()
            .all()
        )
        reader = AlchemyReader(connection)
        approvals = {key: readers.approval(reader, key) for key in keys}
        refused: dict[tuple[int, int], list[str]] = {}
        for round_row in rounds:
            for fate in readers.candidate_fates(reader, cid, int(round_row.round_index)):
                if fate["fate"] == "refused":
                    where = (int(round_row.round_index), int(fate["call_index"]))
                    refused.setdefault(where, []).append(_refusal(fate))
    return {
        "refused": refused,
        "campaign": campaign,
        "rounds": rounds,
        "calls": calls,
        "accepted": accepted,
        "decisions": decisions,
        "batch_sizes": batch_sizes,
        "approvals": approvals,
    }


def derive_node_hours(record: Mapping[str, Any]) -> float | None:
    """Return node-hours per simulation from the recorded budget counters, if any round shows it.

    The engine charges ``len(batch) * node_hours_per_simulation`` per completed round;
    the checkpointed ``budget_spent`` before and after a round gives it back.
    """
    spent_before = 0.0
    for row in record["rounds"]:
        state = row.policy_state if isinstance(row.policy_state, dict) else {}
        if row.status != "completed" or not isinstance(state.get("campaign"), dict):
            continue
        spent_after = float(state["campaign"].get("budget_spent", 0.0))
        size = record["batch_sizes"].get(int(row.round_index), 0)
        if size > 0 and spent_after > spent_before:
            # Site costs are written as short decimals: undo the float noise of the division.
            return float(f"{(spent_after - spent_before) / size:.12g}")
        spent_before = spent_after
    return None


def infer_can_suspend(record: Mapping[str, Any]) -> bool:
    """Return False when a recorded ASK became an escalation (the run could not pause)."""
    for row in record["decisions"]:
        for firing in (row.extra or {}).get("fired", []) or []:
            if firing.get("severity") == "ASK" and firing.get("effect") == "escalate":
                return False
    return True


def _refusal(fate: Mapping[str, Any]) -> str:
    """Return a refused candidate as a step names it: ``proposal 2 (far-corner)``."""
    return f"{fate['source']} {fate['candidate_index']} ({fate['rule'] or 'policy'})"


def _candidates(call: Any, accepted: Mapping[int, Any]) -> list[list[float]] | None:
    if call.disposition == "accepted":
        row = accepted.get(int(call.id))
        value = None if row is None else row.value
        rows = value.get("candidates") if isinstance(value, dict) else None
    elif call.disposition == "fallback":
        rows = call.fallback_value
    else:  # pending, failed or not_accepted: the gate never produced a batch
        return None
    return None if rows is None else [[float(x) for x in row] for row in rows]


@dataclass
class _Replayer:
    name: str
    spec: CampaignSpec
    policy: Policy
    record: Mapping[str, Any]
    result: ReplayResult
    counters: Counters = field(default_factory=Counters)

    def run(self) -> None:
        calls_by_round: dict[int, list[Any]] = {}
        for call in self.record["calls"]:
            calls_by_round.setdefault(int(call.round_index), []).append(call)
        decided: dict[int, list[Any]] = {}
        for row in self.record["decisions"]:
            decided.setdefault(int(row.round_index), []).append(row)
        indices = sorted({int(r.round_index) for r in self.record["rounds"]} | set(calls_by_round))
        for index in indices:
            calls, recorded = calls_by_round.get(index, []), decided.get(index, [])
            if self.result.stopped_round is not None:
                self._not_reached(index, calls, recorded)
            else:
                self._round(index, calls, recorded)

    def _step(self, index: int, call: Any, recorded: list[Any], pos: int, **kw: Any) -> None:
        row = recorded[pos] if pos < len(recorded) else None
        refused = () if call is None else self.record["refused"].get((index, int(call.call_index)))
        outcome = None if row is None else row.outcome
        if outcome is None and refused:
            outcome = ALL_REFUSED  # the live run refused every candidate: no decision recorded
        new_refused = tuple(kw.get("new_refused", ()))
        if kw["new"] not in (NOT_REACHED, NOT_CALLED) and sorted(new_refused) != sorted(
            refused or ()
        ):
            said = f"refuses {', '.join(new_refused) or 'no candidate'}; the record refused "
            said += ", ".join(refused or ()) or "none"
            kw["note"] = "; ".join(n for n in (said, kw.get("note", "")) if n)
        self.result.steps.append(
            ReplayStep(
                round_index=index,
                call_index=None if call is None else int(call.call_index),
                disposition=None if call is None else call.disposition,
                recorded=outcome,
                recorded_rules=tuple(row.rules_fired or ()) if row is not None else (),
                recorded_refused=tuple(refused or ()),
                **kw,
            )
        )

    def _not_reached(self, index: int, calls: list[Any], recorded: list[Any]) -> None:
        for pos, call in enumerate(calls or [None]):
            self._step(index, call, recorded, pos, new=NOT_REACHED)

    def _stop(self, index: int, status: str, code: str | None) -> None:
        self.result.stopped_round = index
        self.result.new_status, self.result.new_error_code = status, code

    def _diverge(self, index: int) -> None:
        if self.result.diverged_from is None:
            self.result.diverged_from = index

    def _recorded_verifier_hours(self, index: int) -> float:
        """Return the verifier node-hours recorded through round ``index`` (no gate re-runs)."""
        hours = 0.0
        for row in self.record["rounds"]:
            state = row.policy_state if isinstance(row.policy_state, dict) else {}
            campaign = state.get("campaign")
            if not isinstance(campaign, dict):
                continue
            if int(row.round_index) <= index and "verifier_hours" in campaign:
                hours = float(campaign["verifier_hours"])
        return hours

    def _recorded_failed_last_batch(self, index: int) -> int:
        """Return the failed tasks of the batch before round ``index``, as the record counted."""
        failed = 0
        for row in self.record["rounds"]:
            state = row.policy_state if isinstance(row.policy_state, dict) else {}
            campaign = state.get("campaign")
            if int(row.round_index) < index and isinstance(campaign, dict):
                failed = int(campaign.get("failed_last_batch", 0))
        return failed

    def _round(self, index: int, calls: list[Any], recorded: list[Any]) -> None:
        self.counters.verifier_hours = self._recorded_verifier_hours(index)
        self.counters.failed_last_batch = self._recorded_failed_last_batch(index)
        start = len(self.result.steps)
        self._judge_round(index, calls, recorded)
        # Recorded gate calls the new policy never makes: it stopped, or ran an earlier batch.
        new = NOT_REACHED if self.result.stopped_round is not None else NOT_CALLED
        for pos in range(len(self.result.steps) - start, len(calls)):
            self._step(index, calls[pos], recorded, pos, new=new)

    def _judge_round(self, index: int, calls: list[Any], recorded: list[Any]) -> None:
        spec = self.spec
        launch: tuple[list[list[float]], str] | None = None
        for pos, call in enumerate(calls):
            emit = functools.partial(self._step, index, call, recorded, pos)
            candidates = _candidates(call, self.record["accepted"])
            if candidates is None:
                emit(new=NO_RECORD, note="the gate produced no batch here; the replay ends")
                self._stop(index, self.result.recorded_status, None)
                break
            judged = self._judge(index, call, candidates)
            refused = tuple(
                _refusal({"source": f.source, "candidate_index": f.index, "rule": f.rule})
                for f in judged.ledger.refused()
            )
            decision = judged.decision
            if decision is None:
                emit(
                    new=ALL_REFUSED,
                    new_refused=refused,
                    note="the candidate rules refuse every candidate: blocked (policy_denied)",
                )
                self._stop(index, "blocked", "policy_denied")
                return
            candidates = judged.candidates
            kind = decision.outcome.kind
            self.counters.decisions.append(kind)
            rules = tuple(f.rule for f in decision.fired)
            step = {"new": kind, "new_rules": rules, "new_reason": decision.outcome.reason}
            step["new_refused"] = refused
            if kind == "retry":
                if int(call.call_index) > spec.policy_retries:
                    emit(**step, note="policy retries exhausted: blocked (policy_denied)")
                    self._stop(index, "blocked", "policy_denied")
                    return
                if pos + 1 < len(calls):
                    emit(**step, note="re-asks the planner: the next recorded gate call answers")
                    continue
                emit(
                    **step,
                    note="would re-ask the planner; no recorded answer, the recorded "
                    "batch stands in from here on",
                )
                self._diverge(index)
                launch = (candidates, call.disposition)
                break
            if kind in STOPS:
                code = getattr(decision.outcome, "code", None) or "policy_denied"
                emit(**step, note=f"the campaign stops ({code})")
                self._stop(index, "blocked" if kind == "block" else "escalated", code)
                return
            note = ""
            if kind == "suspend":
                approved, note = self._approval(index, call, candidates)
                if approved is None:
                    emit(**step, note=note)
                    return
                launch = approved
            else:
                modified = getattr(decision.outcome, "modified", None)
                if modified:
                    candidates = [list(map(float, c)) for c in modified]
                launch = (candidates, call.disposition)
            if pos + 1 < len(calls):
                note = (note + "; " if note else "") + "runs this batch; the record re-asked"
                self._diverge(index)
            emit(**step, note=note)
            break
        if launch is None:
            if not calls:
                self._step(
                    index,
                    None,
                    recorded,
                    0,
                    new=NO_RECORD,
                    note="the recorded campaign never reached this round",
                )
                self._stop(index, self.result.recorded_status, None)
            return
        self._assimilate(index, launch)

    def _approval(
        self, index: int, call: Any, candidates: list[list[float]]
    ) -> tuple[tuple[list[list[float]], str] | None, str]:
        """Return what runs after the approval (None: the campaign stops) and a note.

        The recorded answer to the same request (round, gate call) is reused;
        without one the request is assumed approved.
        """
        spec = self.spec
        row = self.record["approvals"].get(f"{self.name}-r{index}-c{int(call.call_index)}")
        verdict = None if row is None else row.decision
        if verdict is None:
            if row is not None:
                self._stop(index, "awaiting_approval", None)
                return None, "the recorded request is still awaiting an answer"
            return (candidates, call.disposition), "would have asked for approval; assumed approved"
        note = f"would have asked for approval; recorded answer: {verdict}"
        if verdict == "rejected":
            self._stop(index, "blocked", "approval_rejected")
            return None, note
        if verdict == "timeout":
            if spec.approvals.on_timeout == "stop":
                self._stop(index, "blocked", "approval_timeout")
                return None, note
            return ([[float(x) for x in c] for c in call.fallback_value], "fallback"), note
        overrides = row.overrides if isinstance(row.overrides, dict) else {}
        kept, size = overrides.get("candidates"), overrides.get("batch_size")
        if kept and spec.approvals.max_batch_override:  # the approver's subset, as live
            candidates = [candidates[i] for i in sorted(kept) if 0 <= i < len(candidates)]
        elif size and spec.approvals.max_batch_override:
            candidates = candidates[: int(size)]
        return (candidates, call.disposition), note

    def _judge(self, index: int, call: Any, candidates: list[list[float]]) -> CallJudgement:
        """Judge a recorded gate call as the engine judged it live (``judge_call``)."""
        facts = RoundFacts(
            campaign=self.name,
            spec=self.spec,
            counters=self.counters,
            node_hours_per_simulation=self.result.node_hours_per_simulation,
            walltime_remaining=None,
            can_suspend=self.result.can_suspend,
        )
        call_index, disposition = int(call.call_index), str(call.disposition)

        def context_for(batch: Sequence[Sequence[float]]) -> RoundContext:
            return round_context(facts, index, call_index, batch, disposition)

        predictions: list[float | None] = [None] * len(candidates)
        attempt = self.record["accepted"].get(int(call.id))
        if disposition == "accepted" and attempt is not None:
            predictions = candidate_predictions([attempt], len(candidates))
        fallback = [[float(x) for x in row] for row in call.fallback_value or []]
        return judge_call(self.policy, context_for, candidates, predictions, fallback)

    def _assimilate(self, index: int, launch: tuple[list[list[float]], str]) -> None:
        candidates, disposition = launch
        hours = len(candidates) * self.result.node_hours_per_simulation
        if hours > self.spec.budget_node_hours - self.counters.spent + 1e-9:
            last = self.result.steps[-1]
            note = "; ".join(n for n in (last.note, "the batch exceeds the budget: blocked") if n)
            self.result.steps[-1] = replace(last, note=note)
            self._stop(index, "blocked", "budget_exceeded")
            return
        self.counters.after_batch(disposition, hours)


def replay(
    store: ProvenanceStore,
    name: str,
    policy: Policy,
    *,
    node_hours_per_simulation: float | None = None,
    can_suspend: bool | None = None,
    site_node_hours: Callable[[str], float | None] | None = None,
) -> ReplayResult:
    """Judge every recorded round of campaign ``name`` again with ``policy`` (fresh state).

    Args:
        store: The campaign's provenance store (read-only is enough).
        name: The campaign.
        policy: The new policy; its state is reset first and advanced by the replay.
        node_hours_per_simulation: The cost per simulation; None derives it from the
            recorded budget counters, then falls back to ``site_node_hours``.
        can_suspend: Whether the run could pause for approvals; None infers it.
        site_node_hours: Returns the cost in the site config of a given name, if it
            loads; asked only when the record does not tell.

    Raises:
        NotFound: No campaign ``name``.
        SpecInvalid: The recorded spec does not validate, or no node-hours figure is known.
    """
    record = read_record(store, name)
    campaign = record["campaign"]
    spec = spec_from_dict(dict(campaign.spec), source=f"campaign {name!r} (recorded spec)")
    source = "given"
    nhps = node_hours_per_simulation
    if nhps is None:
        nhps, source = derive_node_hours(record), "derived from the recorded budget counters"
    if nhps is None and site_node_hours is not None:
        nhps, source = site_node_hours(str(campaign.site)), f"site config {campaign.site!r}"
    if nhps is None:
        from policies import SpecInvalid

        raise SpecInvalid(
            "cannot tell the node-hours per simulation; pass --node-hours-per-simulation",
            details={"campaign": name, "field": "node_hours_per_simulation"},
        )
    policy.reset()
    result = ReplayResult(
        campaign=name,
        policy=policy.name,
        recorded_status=str(campaign.status),
        new_status="completed",
        new_error_code=None,
        node_hours_per_simulation=nhps,
        node_hours_source=source,
        can_suspend=infer_can_suspend(record) if can_suspend is None else can_suspend,
    )
    _Replayer(name, spec, policy, record, result).run()
    if result.stopped_round is None and campaign.status != "completed":
        # The recorded run stopped and the new policy would have gone on: what the
        # rounds after the record's end would have done is unknown.
        result.new_status = "runs past the record"
    return result
