"""The typed round context rules judge, and its view as CEL variables."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field


class BatchSummary(BaseModel):
    """What the proposed batch would cost: its size, candidates and node-hours."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: int = Field(ge=0, description="Number of candidates in the batch.")
    candidates: list[list[float]] = Field(
        default_factory=list, description="The candidate parameter vectors."
    )
    node_hours: float = Field(ge=0.0, description="Estimated node-hours the batch would use.")


class RoundContext(BaseModel):
    """Everything a rule may look at when it judges one proposal of one round."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    campaign: str = Field(min_length=1, description="The campaign's id.")
    round_index: int = Field(ge=0, description="Which round of the campaign, from 0.")
    attempt: int = Field(ge=1, description="Which gate call in this round, from 1.")
    batch: BatchSummary = Field(description="The proposed batch.")
    proposal_key: str = Field(
        min_length=1, description="Content hash of the batch (see proposal_key())."
    )
    disposition: Literal["accepted", "fallback"] = Field(
        description="Whether the gate accepted the agent's proposal or fell back."
    )
    consecutive_fallbacks: int = Field(
        ge=0, description="Rounds in a row (this one included) that used the fallback."
    )
    budget_spent: float = Field(ge=0.0, description="Node-hours spent so far.")
    budget_remaining: float = Field(description="Node-hours left in the campaign budget.")
    walltime_remaining: float | None = Field(
        default=None, description="Seconds left on the allocation, if known."
    )
    earlier_decisions: tuple[str, ...] = Field(
        default=(), description="Outcome kinds of earlier rounds, oldest first."
    )
    can_suspend: bool = Field(
        default=True, description="Whether the run can pause durably for an approval."
    )
    failed_last_batch: int = Field(
        default=0, ge=0, description="Tasks of the previous round's batch that did not finish."
    )
    default_approvers: tuple[str, ...] = Field(
        default=(),
        description=(
            "Who may approve for an ASK rule that names no approvers of its own "
            "(the campaign's [approvals] approvers)."
        ),
    )


def proposal_key(candidates: Sequence[Sequence[float]]) -> str:
    """Return a stable sha256 hex digest of ``candidates`` as canonical JSON.

    Integers and floats of equal value hash alike (``1`` and ``1.0``), so a
    proposal that only changed number formatting counts as identical.
    """
    canonical = [[float(value) for value in row] for row in candidates]
    text = json.dumps(canonical, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# The maps a CEL expression may read, and the fields of each. The loader checks
# expressions against this table, so a typo fails at load, not mid-campaign.
CEL_FIELDS: Final[dict[str, frozenset[str]]] = {
    "allocation": frozenset({"walltime_remaining", "has_walltime"}),
    "batch": frozenset({"size", "node_hours", "candidates"}),
    "budget": frozenset({"spent", "remaining"}),
    "campaign": frozenset({"name"}),
    "gate": frozenset({"disposition", "consecutive_fallbacks"}),
    "history": frozenset({"decisions", "failed_last_batch"}),
    "round": frozenset({"index", "attempt"}),
}


# What a candidate-scoped rule reads beside the round's maps: one candidate of the batch.
CANDIDATE_FIELDS: Final[frozenset[str]] = frozenset({"x", "index", "prediction", "has_prediction"})


class CandidateView(BaseModel):
    """One candidate as a candidate-scoped rule sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="Position of the candidate in the proposed batch.")
    x: list[float] = Field(description="The candidate's coordinates.")
    prediction: float | None = Field(
        default=None, description="The gate's verifier prediction, when the verifier ran."
    )


def candidate_variables(candidate: CandidateView) -> dict[str, Any]:
    """Return ``candidate`` as the CEL map ``candidate`` (-1.0 plus a flag when unpredicted)."""
    prediction = candidate.prediction
    return {
        "index": candidate.index,
        "x": [float(v) for v in candidate.x],
        "prediction": -1.0 if prediction is None else float(prediction),
        "has_prediction": prediction is not None,
    }


def sample_candidates() -> tuple[CandidateView, ...]:
    """Return candidates for the load-time trial of candidate-scoped expressions."""
    return CandidateView(index=0, x=[0.5, 1.5], prediction=2.5), CandidateView(
        index=1, x=[2.0, 3.0]
    )


def cel_variables(ctx: RoundContext, *, with_candidates: bool = True) -> dict[str, Any]:
    """Return ``ctx`` as the CEL maps rules read (``round``, ``batch``, ...).

    Args:
        ctx: The round context.
        with_candidates: Include ``batch.candidates``. Converting them costs far
            more than everything else together, so the policy leaves them out
            when no rule reads them.
    """
    walltime = ctx.walltime_remaining
    batch: dict[str, Any] = {"size": ctx.batch.size, "node_hours": float(ctx.batch.node_hours)}
    if with_candidates:
        batch["candidates"] = [[float(v) for v in row] for row in ctx.batch.candidates]
    return {
        "allocation": {
            # CEL has no null-safe arithmetic; -1.0 plus a flag keeps comparisons total.
            "walltime_remaining": -1.0 if walltime is None else float(walltime),
            "has_walltime": walltime is not None,
        },
        "batch": batch,
        "budget": {"spent": float(ctx.budget_spent), "remaining": float(ctx.budget_remaining)},
        "campaign": {"name": ctx.campaign},
        "gate": {
            "disposition": ctx.disposition,
            "consecutive_fallbacks": ctx.consecutive_fallbacks,
        },
        "history": {
            "decisions": list(ctx.earlier_decisions),
            "failed_last_batch": ctx.failed_last_batch,
        },
        "round": {"index": ctx.round_index, "attempt": ctx.attempt},
    }


def sample_contexts() -> tuple[RoundContext, ...]:
    """Return representative contexts for the load-time trial of CEL expressions.

    Two shapes, so both branches of optional fields (walltime known or not,
    history empty or not) are exercised.
    """
    candidates = [[0.5, 1.5], [2.0, 3.0]]
    batch = BatchSummary(size=2, candidates=candidates, node_hours=1.5)
    first = RoundContext(
        campaign="sample",
        round_index=0,
        attempt=1,
        batch=batch,
        proposal_key=proposal_key(candidates),
        disposition="accepted",
        consecutive_fallbacks=0,
        budget_spent=0.0,
        budget_remaining=100.0,
    )
    later = first.model_copy(
        update={
            "round_index": 3,
            "attempt": 2,
            "disposition": "fallback",
            "consecutive_fallbacks": 1,
            "budget_spent": 40.0,
            "budget_remaining": 60.0,
            "walltime_remaining": 3600.0,
            "earlier_decisions": ("continue", "retry", "suspend"),
            "can_suspend": False,
            "failed_last_batch": 2,
        }
    )
    return first, later
