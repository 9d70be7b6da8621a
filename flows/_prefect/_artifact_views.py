"""What a campaign run's Prefect artifacts say, read from the provenance (no Prefect here).

The UI's Artifacts tab shows, per campaign (each under a key of its own, so the
Artifacts page groups the versions): the round table (:func:`round_rows`), the
evidence of a waiting approval (:func:`evidence_markdown`) and the run's summary
(:func:`summary_markdown`). ``flows._prefect._artifacts`` publishes them; these
functions only render, so the secrets test renders them from a recorded campaign.

What they never carry: the planner's own text (its rationale, a refusal's words),
an answer's one-time code, the site's secrets, a notification URL. They show
numbers, rule names, approvers, keys and commands.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from flows._engine._approval import ApprovalRequest
from flows._engine._campaign_state import build_surrogate
from flows._provenance import ProvenanceStore

# Prefect allows lowercase letters, digits and dashes in an artifact key.
_NOT_IN_KEY = re.compile(r"[^a-z0-9]+")
# The round table's columns, in the order the UI shows them.
ROUND_COLUMNS = (
    "round",
    "gate",
    "policy",
    "refused",
    "done",
    "failed",
    "relaunched",
    "round best",
    "best so far",
    "node-hours",
)


def artifact_key(campaign: str, what: str) -> str:
    """Return the stable artifact key of ``what`` (``rounds``, ``batch``, ...) for a campaign.

    A campaign name that is not already a key (``Demo_2``) is folded into one and
    given 6 hex digits of its hash, so two names that fold alike keep apart.
    """
    slug = _NOT_IN_KEY.sub("-", campaign.lower()).strip("-") or "campaign"
    if slug != campaign:
        slug += "-" + hashlib.sha256(campaign.encode()).hexdigest()[:6]
    return f"unattended-{slug}-{what}"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _spent(state: Any) -> float:
    """Return the node-hours a round's checkpoint says were spent so far (tasks + verifier)."""
    if isinstance(state, str):  # JSON as text where the driver does not parse it
        state = json.loads(state)
    counters = state.get("campaign") if isinstance(state, dict) else None
    if not isinstance(counters, dict):
        return 0.0
    return sum(_number(counters.get(k)) or 0.0 for k in ("budget_spent", "verifier_hours"))


def _gate(entry: Mapping[str, Any]) -> str:
    """Return the round's gate calls: ``accepted after 2 attempts``, or a count per disposition."""
    dispositions: dict[str, int] = entry.get("dispositions") or {}
    used = int(entry.get("attempts") or 0)
    attempts = f"{used} attempt{'' if used == 1 else 's'}"
    if sum(dispositions.values()) == 1:
        return f"{next(iter(dispositions))} after {attempts}"
    calls = ", ".join(f"{n} {d}" for d, n in sorted(dispositions.items()))
    return f"{calls}; {attempts}" if calls else "-"


# One row per round: what the summary does not say (candidates refused, the checkpoint's spend).
_REFUSED = text(
    "SELECT round_index, count(*) AS n FROM candidate_fate "
    "WHERE campaign_id = :cid AND fate = 'refused' GROUP BY round_index"
)
_CAMPAIGN = text("SELECT id FROM campaign WHERE name = :name")
_SPENT = text(
    "SELECT round_index, policy_state FROM round "
    "WHERE campaign_id = :cid AND status = 'completed' ORDER BY round_index"
)


class RoundTable:
    """The round table's rows, one per round the provenance holds.

    Read whole each time from the campaign's summary and two small queries (a
    campaign of 1,000 rounds reads 1,000 short rows, a few milliseconds), so a
    run that starts again mid-campaign shows every round.
    """

    def __init__(self, campaign: str) -> None:
        self.campaign = campaign

    def rows(self, store: ProvenanceStore) -> list[dict[str, Any]]:
        """Return every round's row, in order, with the best value so far."""
        summary = store.summary(self.campaign)
        with store.engine.connect() as connection:
            cid = connection.execute(_CAMPAIGN, {"name": self.campaign}).scalar_one()
            refused = {
                int(r.round_index): int(r.n) for r in connection.execute(_REFUSED, {"cid": cid})
            }
            spent = {
                int(r.round_index): _spent(r.policy_state)
                for r in connection.execute(_SPENT, {"cid": cid})
            }
        best_so_far: float | None = None
        rows = []
        for entry in summary["rounds"]:
            index = int(entry["index"])
            best = _number(entry.get("best"))
            if best is not None and (best_so_far is None or best < best_so_far):
                best_so_far = best
            done = int(entry.get("done") or 0)
            hours = spent.get(index)
            before = spent.get(index - 1, 0.0)
            rows.append(
                {
                    "round": index,
                    "gate": _gate(entry),
                    "policy": entry.get("decision") or "-",
                    "refused": refused.get(index, 0),
                    "done": done,
                    "failed": int(entry.get("tasks") or 0) - done,
                    "relaunched": int(entry.get("interruptions") or 0),
                    "round best": best,
                    "best so far": best_so_far,
                    "node-hours": None if hours is None else round(hours - before, 6),
                }
            )
        return rows


def _point(candidate: Sequence[float]) -> str:
    return "(" + ", ".join(f"{x:.4g}" for x in candidate) + ")"


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _uncertainties(
    store: ProvenanceStore, campaign: str, points: Sequence[Sequence[float]]
) -> list[tuple[float, float] | None]:
    """Return the surrogate's mean and standard deviation at each point (None: no data yet)."""
    surrogate = build_surrogate(store.load_checkpoint(campaign).surrogate_states)
    if not surrogate.observations or not points:
        return [None] * len(points)
    mean, std = surrogate.predict([list(p) for p in points])
    return [(float(m), float(s)) for m, s in zip(mean, std, strict=True)]


def _candidate_table(
    points: Sequence[Sequence[float]],
    predictions: Sequence[float | None],
    uncertain: Sequence[tuple[float, float] | None],
) -> Iterator[str]:
    yield "| # | candidate | verifier predicts | surrogate mean ± std |"
    yield "| --- | --- | --- | --- |"
    for i, point in enumerate(points):
        predicted = predictions[i] if i < len(predictions) else None
        guess = uncertain[i] if i < len(uncertain) else None
        yield (
            f"| {i} | {_point(point)} | {'–' if predicted is None else f'{predicted:.4g}'} | "
            f"{'no data yet' if guess is None else f'{guess[0]:.4g} ± {guess[1]:.3g}'} |"
        )


def evidence_markdown(
    request: ApprovalRequest, store: ProvenanceStore, flow_run_id: str | None
) -> str:
    """Return what an approver needs to decide ``request``, as the UI renders it.

    The rule and why it fired, each candidate with the verifier's prediction and the
    surrogate's mean and standard deviation there, the fallback batch, the deadline
    and what happens at it, the commands to answer. Not the planner's rationale.
    """
    proposed, fallback = request.proposed, request.fallback
    fell_back = request.disposition == "fallback"
    at_deadline = (
        "the deterministic fallback batch below runs instead"
        if request.on_timeout == "fallback"
        else "the campaign stops (`approval_timeout`)"
    )
    uncertain = _uncertainties(store, request.campaign, [*proposed, *fallback])
    run = flow_run_id or "RUN"
    code = " --code" if request.require_proof else ""
    why = request.reason + (f" Condition: {request.condition}." if request.condition else "")
    note = [f"**The rule's note:** {request.advice}", ""] if request.advice else []
    best = "none yet" if request.best_so_far is None else f"{request.best_so_far:.4g}"
    fallback_hours = request.fallback_node_hours
    return "\n".join(
        [
            f"## Round {request.round_index} of `{request.campaign}` waits for approval",
            "",
            f"**Rule** `{request.rule}` asked: {why}",
            "",
            *note,
            f"**Allowed approvers:** {', '.join(request.approvers) or '(none configured)'}"
            + (" (a one-time code is required)" if request.require_proof else ""),
            "",
            f"**Deadline:** {_when(request.deadline)}. With no allowed answer by then, "
            f"{at_deadline}.",
            "",
            f"**Approve** runs {'the fallback' if fell_back else 'the proposed'} batch: "
            f"{len(proposed)} candidates, {request.node_hours:.3g} node-hours "
            f"({request.budget_remaining:.3g} left in the budget). **Reject** stops the "
            "campaign (`approval_rejected`).",
            "",
            f"**Best result so far:** {best} (lowest objective of any finished task).",
            "",
            f"### Proposed batch ({request.disposition})",
            "",
            *_candidate_table(proposed, request.predictions, uncertain[: len(proposed)]),
            "",
            "### What the fallback would run instead"
            + (f" ({fallback_hours:.3g} node-hours)" if fallback_hours is not None else ""),
            "",
            *_candidate_table(fallback, (), uncertain[len(proposed) :]),
            "",
            "### Answer from a terminal",
            "",
            f"    unattended approve {run} --as NAME{code}",
            f"    unattended approve {run} --as NAME{code} --reject --comment WHY",
            "",
            f"Approval `{request.key}`; in the UI: the run's menu > Resume.",
        ]
    )


def answered_markdown(request_key: str, round_index: int, verdict: str, by: str) -> str:
    """Return the evidence artifact's last version: how the request was answered."""
    return "\n".join(
        [
            f"## Round {round_index}: approval {verdict}",
            "",
            f"Approval `{request_key}` was answered **{verdict}** by `{by or 'nobody'}`.",
        ]
    )


def summary_markdown(store: ProvenanceStore, campaign: str, status: str, code: str | None) -> str:
    """Return the run's end: status, best value and where, budget used, what to run next."""
    summary = store.summary(campaign)
    spec = summary["campaign"]["spec"]
    best = summary["best_result"]
    if best is None:
        where = "no task finished with a value"
    else:
        candidate = best.get("candidate")
        at = f" at {_point(candidate)}" if isinstance(candidate, list) else ""
        where = (
            f"**{best['objective']:.6g}** in round {best['round_index']}, task "
            f"{best['task_index']}{at} (`{best['key']}`)"
        )
    checkpoint = store.load_checkpoint(campaign)
    state = (checkpoint.policy_state or {}).get("campaign") or {}
    tasks = _number(state.get("budget_spent")) or 0.0
    verifier = _number(state.get("verifier_hours")) or 0.0
    budget = _number(spec.get("budget_node_hours"))
    done = checkpoint.last_completed_round
    return "\n".join(
        [
            f"## Campaign `{campaign}`: {status}" + (f" (`{code}`)" if code else ""),
            "",
            f"**Rounds completed:** {0 if done is None else done + 1} of {spec.get('rounds')}.",
            "",
            f"**Best value:** {where}.",
            "",
            f"**Budget used:** {tasks + verifier:.4g} node-hours ({tasks:.4g} tasks, "
            f"{verifier:.4g} verifier)" + (f" of {budget:.4g}." if budget is not None else "."),
            "",
            "### The full picture",
            "",
            f"    unattended report {campaign}",
            f"    unattended export {campaign} --format ro-crate",
        ]
    )
