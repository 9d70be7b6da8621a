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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, assert_never

from acceptance import Attempt
from flows._settings import Settings
from flows._spec import (
    LLMPlannerSpec,
    LoadedSpec,
    ScriptedPlannerSpec,
    SurrogatePlannerSpec,
)
from policies import Policy, load_policy
from tasks import (
    Bounds,
    GaussianProcess,
    LLMPlanner,
    Proposal,
    ScriptedPlanner,
    SurrogatePlanner,
)

# The gate's producer: given every earlier attempt, return the next proposal.
Producer = Callable[[tuple[Attempt[Proposal], ...]], Awaitable[Proposal]]


def derive_seed(seed: int, *parts: int) -> int:
    """Return a seed for one round and gate call, stable across processes."""
    material = json.dumps([seed, *parts]).encode()
    return int.from_bytes(hashlib.sha256(material).digest()[:8], "big") >> 1


def build_policy(loaded: LoadedSpec, state: Mapping[str, Any] | None) -> Policy:
    """Return the campaign's policy (no rules when the spec names none), state restored."""
    spec = loaded.spec
    policy = load_policy(loaded.resolve(spec.policy)) if spec.policy else Policy([], name="none")
    if state:
        policy.load_state(dict(state))
    return policy


def build_surrogate(states: Sequence[Mapping[str, Any]] = ()) -> GaussianProcess:
    """Return the surrogate, restored from its checkpointed states (in round order), if any."""
    return GaussianProcess.from_states([dict(s) for s in states]) if states else GaussianProcess()


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

    def for_round(self, surrogate: GaussianProcess, round_index: int) -> Producer:
        """Return the producer for this round (an ``accept`` producer)."""
        spec = self.loaded.spec
        planner = spec.planner
        match planner:
            case ScriptedPlannerSpec():
                if self._scripted is None:
                    path = self.loaded.resolve(planner.transcript)
                    self._scripted = ScriptedPlanner(path, position=self.position)
                return self._scripted
            case SurrogatePlannerSpec():
                seed = derive_seed(spec.seed, round_index, 0)
                return SurrogatePlanner(surrogate, self.bounds, spec.batch_size, seed)
            case LLMPlannerSpec():
                if self._llm is None:
                    key = self.env.get(planner.api_key_env) if planner.api_key_env else None
                    self._llm = LLMPlanner(
                        planner.base_url,
                        planner.model,
                        api_key=key,
                        count=spec.batch_size,
                        bounds=self.bounds,
                        objective=planner.objective,
                        timeout=planner.timeout,
                    )
                return self._llm
            case _:
                assert_never(planner)

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


def allocation_end(
    env: Mapping[str, str], *, walltime_seconds: float | None = None
) -> datetime | None:
    """Return when the batch allocation ends, from the job's environment, if known.

    See :meth:`flows._settings.Settings.allocation_window`: ``UNATTENDED_ALLOCATION_END``,
    else ``SLURM_JOB_END_TIME``, else the job's start plus ``walltime_seconds`` (the
    site's ``scheduler.walltime``). A value that is not epoch seconds is ``SpecInvalid``.
    """
    return Settings.from_env(env).allocation_window(walltime_seconds).end


def walltime_remaining(
    env: Mapping[str, str],
    *,
    now: float | None = None,
    walltime_seconds: float | None = None,
) -> float | None:
    """Return seconds left on the allocation (see ``allocation_end``), if known."""
    window = Settings.from_env(env).allocation_window(walltime_seconds)
    moment = time.time() if now is None else now
    return window.remaining(datetime.fromtimestamp(moment, UTC))
