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
from datetime import UTC, datetime, timedelta
from typing import Any

from flows._spec import ApprovalsSpec, LoadedSpec
from policies import Policy, load_policy
from tasks import Bounds, GaussianProcess, LLMPlanner, ScriptedPlanner, SurrogatePlanner


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


# Checked in order; the first that parses wins. PBS exports no end time of the job
# (PBS_WALLTIME is Torque-only and says nothing of when the job started), so a PBS
# job script sets UNATTENDED_ALLOCATION_END itself.
ALLOCATION_END_VARIABLES = ("UNATTENDED_ALLOCATION_END", "SLURM_JOB_END_TIME")
# Slurm's start time, for a site walltime when no end time is exported.
ALLOCATION_START_VARIABLES = ("UNATTENDED_ALLOCATION_START", "SLURM_JOB_START_TIME")
ALLOCATION_NOTE = "allocation ends "


def _epoch(env: Mapping[str, str], variables: tuple[str, ...]) -> float | None:
    for variable in variables:
        raw = env.get(variable)
        if raw:
            try:
                return float(raw)
            except ValueError:
                continue
    return None


def allocation_end(
    env: Mapping[str, str], *, walltime_seconds: float | None = None
) -> datetime | None:
    """Return when the batch allocation ends, from the job's environment, if known.

    Reads ``UNATTENDED_ALLOCATION_END`` or Slurm's ``SLURM_JOB_END_TIME`` (epoch
    seconds); failing those, the job's start (``UNATTENDED_ALLOCATION_START`` or
    ``SLURM_JOB_START_TIME``) plus ``walltime_seconds`` (the site's
    ``scheduler.walltime``).
    """
    end = _epoch(env, ALLOCATION_END_VARIABLES)
    if end is None and walltime_seconds is not None:
        start = _epoch(env, ALLOCATION_START_VARIABLES)
        end = None if start is None else start + walltime_seconds
    return None if end is None else datetime.fromtimestamp(end, UTC)


def walltime_remaining(
    env: Mapping[str, str],
    *,
    now: float | None = None,
    walltime_seconds: float | None = None,
) -> float | None:
    """Return seconds left on the allocation (see ``allocation_end``), if known."""
    end = allocation_end(env, walltime_seconds=walltime_seconds)
    if end is None:
        return None
    moment = time.time() if now is None else now
    return max(0.0, end.timestamp() - moment)


def allocation_note(end: datetime | None) -> str | None:
    """Return the approval row's description that records the allocation's end."""
    return None if end is None else ALLOCATION_NOTE + end.astimezone(UTC).isoformat()


def recorded_allocation_end(description: str | None) -> datetime | None:
    """Return the allocation end an approval row recorded with ``allocation_note``."""
    if not description or not description.startswith(ALLOCATION_NOTE):
        return None
    try:
        end = datetime.fromisoformat(description[len(ALLOCATION_NOTE) :].strip())
    except ValueError:
        return None
    return end if end.tzinfo else end.replace(tzinfo=UTC)


def approval_deadline(
    requested_at: datetime,
    description: str | None,
    approvals: ApprovalsSpec,
) -> datetime:
    """Return when an approval request times out: the earlier of its timeout and the allocation.

    Computed from the approval row only (``requested_at`` and the allocation end
    recorded in its ``description``), so every replay of the flow and the
    watchdog on the login node agree on the same instant. The allocation bound is
    its end minus ``approvals.allocation_margin_minutes``, so the campaign falls
    back or stops cleanly before the batch system kills it; never before the request.
    """
    requested = requested_at if requested_at.tzinfo else requested_at.replace(tzinfo=UTC)
    deadline = requested + timedelta(minutes=approvals.timeout_minutes)
    end = recorded_allocation_end(description)
    if end is not None:
        bound = end - timedelta(minutes=approvals.allocation_margin_minutes)
        deadline = min(deadline, max(requested, bound))
    return deadline
