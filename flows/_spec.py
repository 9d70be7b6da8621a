"""The campaign spec: one TOML file, validated before anything is registered or launched.

A bad spec raises ``SpecInvalid`` naming the file and the dotted field, with what
was expected; nothing is written anywhere before the spec validates.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from policies import SpecInvalid

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectiveSpec(_Strict):
    """What a candidate is and how it is simulated."""

    lower: list[float] = Field(
        min_length=1, max_length=64, description="Lower bound per dimension."
    )
    upper: list[float] = Field(
        min_length=1, max_length=64, description="Upper bound per dimension."
    )
    simulation: Literal["demo"] | list[str] = Field(
        default="demo",
        description=(
            'The simulation: "demo" (the built-in synthetic objective run as an executable), '
            "or an argv list that reads one candidate as JSON on stdin and writes "
            '{"value": float} on stdout.'
        ),
    )
    simulation_cost: float = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        description="Seconds the demo simulation sleeps per candidate.",
    )
    verifier_limit: float | None = Field(
        default=None,
        description=(
            "Reject a proposal when the low-fidelity verifier predicts a value above this for "
            "any candidate (minimisation). None: no verifier."
        ),
    )

    @model_validator(mode="after")
    def _bounds(self) -> ObjectiveSpec:
        if len(self.lower) != len(self.upper):
            raise ValueError("lower and upper must have the same length")
        for i, (lo, hi) in enumerate(zip(self.lower, self.upper, strict=True)):
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError(f"bound {i} is not finite")
            if not lo < hi:
                raise ValueError(f"bound {i}: lower must be below upper")
        return self


class PlannerSpec(_Strict):
    """Who proposes the batches."""

    kind: Literal["scripted", "surrogate", "llm"] = Field(description="The planner.")
    transcript: str | None = Field(
        default=None, description="Scripted: a JSON-lines transcript, relative to the spec file."
    )
    base_url: str | None = Field(
        default=None,
        description="LLM: the OpenAI-compatible endpoint (e.g. vLLM on the allocation).",
    )
    model: str | None = Field(default=None, max_length=200, description="LLM: the model name.")
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="LLM: the environment variable holding the API key (never the key itself).",
    )
    timeout: float = Field(default=60.0, gt=0, le=3600, description="LLM: seconds per request.")
    objective: str = Field(
        default="Minimise the objective.", max_length=4000, description="LLM: the task in words."
    )

    @model_validator(mode="after")
    def _complete(self) -> PlannerSpec:
        if self.kind == "scripted" and not self.transcript:
            raise ValueError("a scripted planner needs 'transcript'")
        if self.kind == "llm" and not (self.base_url and self.model):
            raise ValueError("an llm planner needs 'base_url' and 'model'")
        return self


class ApprovalsSpec(_Strict):
    """Who may approve, and what happens when nobody answers."""

    approvers: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default_factory=list,
        max_length=100,
        description="People allowed to approve, for rules that name none of their own.",
    )
    timeout_minutes: float = Field(
        default=24 * 60.0, gt=0, le=30 * 24 * 60, description="How long a request waits."
    )
    on_timeout: Literal["fallback", "stop"] = Field(
        default="stop",
        description='"fallback": run the deterministic fallback batch; "stop": end the run.',
    )
    max_batch_override: bool = Field(
        default=True, description="Whether an approver may shrink the batch when approving."
    )
    allocation_margin_minutes: float = Field(
        default=15.0,
        ge=0,
        le=7 * 24 * 60,
        description=(
            "Answer by this long before the batch allocation ends (when its end is known), "
            "so the campaign follows on_timeout cleanly instead of dying mid-wait."
        ),
    )


class CampaignSpec(_Strict):
    """A whole campaign, as written in its TOML file."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Campaign name: lowercase, digits, - and _."
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of every random choice.")
    rounds: int = Field(ge=1, le=10_000, description="How many rounds to run.")
    batch_size: int = Field(ge=1, le=100_000, description="Candidates per batch.")
    attempts: int = Field(default=1, ge=1, le=50, description="The gate's attempt budget per call.")
    policy_retries: int = Field(
        default=1, ge=0, le=20, description="Gate calls added in a round after a policy Retry."
    )
    budget_node_hours: float = Field(gt=0, le=1e9, description="Node-hours the campaign may spend.")
    objective: ObjectiveSpec
    planner: PlannerSpec
    policy: str | None = Field(
        default=None, description="A policy TOML file, relative to the spec file. None: no rules."
    )
    approvals: ApprovalsSpec = Field(default_factory=ApprovalsSpec)
    site: str = Field(default="local", description="The site config name or path.")

    @property
    def dim(self) -> int:
        """Return the number of coordinates of a candidate."""
        return len(self.objective.lower)


class LoadedSpec(BaseModel):
    """A validated spec and where it came from (paths in it resolve against ``directory``)."""

    model_config = ConfigDict(frozen=True)

    spec: CampaignSpec
    path: Path
    raw: dict[str, Any]

    @property
    def directory(self) -> Path:
        """Return the folder the spec's relative paths resolve against."""
        return self.path.parent

    def resolve(self, relative: str) -> Path:
        """Return ``relative`` resolved against the spec's folder."""
        candidate = Path(relative).expanduser()
        return candidate if candidate.is_absolute() else (self.directory / candidate).resolve()


def _field_of(error: Mapping[str, Any]) -> str:
    """Return the dotted field of a validation error, without pydantic's union/validator tags."""
    parts = [str(p) for p in error.get("loc", ()) if re.fullmatch(r"\w+", str(p))]
    return ".".join(parts) or "(top level)"


def spec_from_dict(data: dict[str, Any], *, source: str = "<spec>") -> CampaignSpec:
    """Validate ``data`` as a campaign spec; raise ``SpecInvalid`` naming the source and field."""
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        field = _field_of(first)
        raise SpecInvalid(
            f"{source}: field '{field}': {first.get('msg', 'invalid')}",
            details={"file": source, "field": field, "errors": exc.error_count()},
        ) from None


def load_campaign(path: str | Path) -> LoadedSpec:
    """Read and validate a campaign spec file, and every file it names.

    Raises:
        SpecInvalid: The file is missing, is not TOML, or a field is wrong; or a
            file it names (transcript, policy) is missing or invalid.
    """
    file = Path(path).expanduser().resolve()
    source = str(file)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecInvalid(
            f"{source}: no such file", details={"file": source, "field": None}
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecInvalid(
            f"{source}: cannot read the file ({type(exc).__name__})",
            details={"file": source, "field": None},
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecInvalid(
            f"{source}: not valid TOML ({exc})", details={"file": source, "field": None}
        ) from None
    spec = spec_from_dict(raw, source=source)
    loaded = LoadedSpec(spec=spec, path=file, raw=raw)
    _check_named_files(loaded)
    return loaded


def _check_named_files(loaded: LoadedSpec) -> None:
    """Fail at load time, not mid-campaign, when a named file is missing or invalid."""
    spec, source = loaded.spec, str(loaded.path)
    if spec.planner.transcript is not None:
        transcript = loaded.resolve(spec.planner.transcript)
        if not transcript.is_file():
            raise SpecInvalid(
                f"{source}: field 'planner.transcript': no such file {transcript}",
                details={"file": source, "field": "planner.transcript"},
            )
        from tasks import ScriptedPlanner

        try:
            ScriptedPlanner(transcript)  # a bad line would otherwise fail mid-campaign
        except SpecInvalid as exc:
            raise SpecInvalid(
                f"{source}: field 'planner.transcript': {exc.message}",
                details={"file": source, "field": "planner.transcript", **exc.details},
            ) from None
    if spec.policy is not None:
        from policies import load_policy

        policy_file = loaded.resolve(spec.policy)
        if not policy_file.is_file():
            raise SpecInvalid(
                f"{source}: field 'policy': no such file {policy_file}",
                details={"file": source, "field": "policy"},
            )
        load_policy(policy_file)  # raises SpecInvalid naming the policy file, rule and field
