"""What a campaign carries from round to round, and how it is rebuilt from a checkpoint.

The provenance database is the checkpoint. On every (re)start the flow reads the
last completed round's states (surrogate, policy, planner, counters) and goes on
from the next round, so a suspended or killed run continues with the same counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flows._spec import LoadedSpec
from policies import Policy, load_policy
from tasks import Bounds, GaussianProcess, LLMPlanner, ScriptedPlanner, SurrogatePlanner


def derive_seed(seed: int, *parts: int) -> int:
    """Return a seed for one round and gate call, stable across processes."""
    material = json.dumps([seed, *parts]).encode()
    return int.from_bytes(hashlib.sha256(material).digest()[:8], "big") >> 1


@dataclass
class Counters:
    """Campaign-wide counts that policies read."""

    budget_spent: float = 0.0
    consecutive_fallbacks: int = 0
    decisions: list[str] = field(default_factory=list)

    def to_state(self) -> dict[str, Any]:
        """Return the counters as JSON-ready data."""
        return {
            "budget_spent": self.budget_spent,
            "consecutive_fallbacks": self.consecutive_fallbacks,
            "decisions": list(self.decisions),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> Counters:
        """Rebuild the counters; unknown keys are ignored."""
        state = state or {}
        return cls(
            budget_spent=float(state.get("budget_spent", 0.0)),
            consecutive_fallbacks=int(state.get("consecutive_fallbacks", 0)),
            decisions=[str(d) for d in state.get("decisions", [])],
        )


def build_policy(loaded: LoadedSpec, state: Mapping[str, Any] | None) -> Policy:
    """Return the campaign's policy (no rules when the spec names none), state restored."""
    spec = loaded.spec
    policy = load_policy(loaded.resolve(spec.policy)) if spec.policy else Policy([], name="none")
    if state:
        policy.load_state(dict(state))
    return policy


def build_surrogate(state: Mapping[str, Any] | None) -> GaussianProcess:
    """Return the surrogate, restored from its checkpointed state when there is one."""
    return GaussianProcess.from_state(dict(state)) if state else GaussianProcess()


class PlannerSlot:
    """The campaign's planner, rebuilt per round, with its checkpointable state."""

    def __init__(
        self,
        loaded: LoadedSpec,
        bounds: Bounds,
        state: Mapping[str, Any] | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.loaded = loaded
        self.bounds = bounds
        self.env = dict(os.environ if env is None else env)
        self.position = int((state or {}).get("position", 0))
        self._scripted: ScriptedPlanner | None = None
        self._llm: LLMPlanner | None = None

    def for_round(self, surrogate: GaussianProcess, round_index: int) -> Any:
        """Return the producer for this round (an ``accept`` producer)."""
        spec = self.loaded.spec
        kind = spec.planner.kind
        if kind == "scripted":
            if self._scripted is None:
                path = self.loaded.resolve(spec.planner.transcript or "")
                self._scripted = ScriptedPlanner(path, position=self.position)
            return self._scripted
        if kind == "surrogate":
            seed = derive_seed(spec.seed, round_index, 0)
            return SurrogatePlanner(surrogate, self.bounds, spec.batch_size, seed)
        if self._llm is None:
            key = (
                self.env.get(spec.planner.api_key_env or "", None)
                if spec.planner.api_key_env
                else None
            )
            self._llm = LLMPlanner(
                spec.planner.base_url or "",
                spec.planner.model or "",
                api_key=key,
                count=spec.batch_size,
                bounds=self.bounds,
                objective=spec.planner.objective,
                timeout=spec.planner.timeout,
            )
        return self._llm

    def skip(self, answers: int) -> None:
        """Move past answers the planner gave before a restart (they are in the provenance)."""
        if self._scripted is not None:
            self._scripted.position += answers
        self.position += answers

    def sync(self) -> None:
        """Take the scripted planner's position after real calls."""
        if self._scripted is not None:
            self.position = self._scripted.position

    def to_state(self) -> dict[str, Any]:
        """Return what a resumed campaign needs to continue the planner."""
        self.sync()
        return {"position": self.position}


def walltime_remaining(env: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Return seconds left on the allocation, from the batch job's environment, if known.

    Reads ``UNATTENDED_ALLOCATION_END`` or Slurm's ``SLURM_JOB_END_TIME`` (epoch seconds).
    """
    moment = time.time() if now is None else now
    for variable in ("UNATTENDED_ALLOCATION_END", "SLURM_JOB_END_TIME"):
        raw = env.get(variable)
        if raw:
            try:
                return max(0.0, float(raw) - moment)
            except ValueError:
                continue
    return None
