"""The campaign spec: one TOML file, validated before anything is registered or launched.

A bad spec raises ``SpecInvalid`` naming the file and the dotted field, with what
was expected; nothing is written anywhere before the spec validates.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from flows._masking import notify_secrets_masked
from flows._paths import absolute, file_problem
from policies import SpecInvalid, UnattendedError
from tasks import NotifyConfig

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
# A campaign spec is a page of TOML; anything bigger is a wrong path, never read whole.
MAX_SPEC_BYTES = 1024 * 1024


def _not_a_bool(value: Any) -> Any:
    # pydantic reads true as 1.0; a boolean where a number belongs is a typo, not a number.
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


Number = Annotated[float, BeforeValidator(_not_a_bool)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectiveSpec(_Strict):
    """What a candidate is and how it is simulated."""

    lower: list[Number] = Field(
        min_length=1, max_length=64, description="Lower bound per dimension."
    )
    upper: list[Number] = Field(
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
    simulation_cost: Number = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        description="Seconds the demo simulation sleeps per candidate.",
    )
    verifier_limit: Annotated[Number, Field(allow_inf_nan=False)] | None = Field(
        default=None,
        description=(
            "Reject a proposal when the low-fidelity verifier predicts a value above this for "
            "any candidate (minimisation); a finite number. None: no verifier."
        ),
    )

    @field_validator("simulation")
    @classmethod
    def _argv(cls, value: Literal["demo"] | list[str]) -> Literal["demo"] | list[str]:
        if isinstance(value, list) and not (value and value[0].strip()):
            raise ValueError("an argv list needs at least the program to run")
        return value

    @field_validator("lower", "upper")
    @classmethod
    def _finite(cls, value: list[float]) -> list[float]:
        for i, bound in enumerate(value):
            if not math.isfinite(bound):
                raise ValueError(f"bound {i} is not finite ({bound})")
        return value

    @field_validator("upper")
    @classmethod
    def _above_lower(cls, upper: list[float], info: ValidationInfo) -> list[float]:
        # Reported on `upper` (the bound read against `lower`), never on the whole objective.
        lower = info.data.get("lower")
        if lower is None:
            return upper  # lower is wrong itself, and reported on its own field
        if len(lower) != len(upper):
            raise ValueError(
                f"has {len(upper)} bounds but lower has {len(lower)}: one pair per dimension"
            )
        for i, (lo, hi) in enumerate(zip(lower, upper, strict=True)):
            if not lo < hi:
                raise ValueError(f"bound {i} ({hi:g}) must be above lower's ({lo:g})")
        return upper


class ScriptedPlannerSpec(_Strict):
    """Replay recorded model answers from a transcript."""

    kind: Literal["scripted"] = Field(description="The planner.")
    transcript: str = Field(
        min_length=1, description="A JSON-lines transcript, relative to the spec file."
    )


class SurrogatePlannerSpec(_Strict):
    """Propose from the campaign's surrogate model (no model endpoint)."""

    kind: Literal["surrogate"] = Field(description="The planner.")


class LLMPlannerSpec(_Strict):
    """Ask an OpenAI-compatible chat endpoint."""

    kind: Literal["llm"] = Field(description="The planner.")
    base_url: str = Field(
        min_length=1, description="The OpenAI-compatible endpoint (e.g. vLLM on the allocation)."
    )
    model: str = Field(min_length=1, max_length=200, description="The model name.")
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="The environment variable holding the API key (never the key itself).",
    )
    timeout: Number = Field(default=60.0, gt=0, le=3600, description="Seconds per request.")
    objective: str = Field(
        default="Minimise the objective.", max_length=4000, description="The task in words."
    )


# Who proposes the batches: one model per ``kind``, so a field of another kind
# (``transcript`` for an llm planner) is refused naming that field.
PlannerSpec = Annotated[
    ScriptedPlannerSpec | SurrogatePlannerSpec | LLMPlannerSpec, Field(discriminator="kind")
]
PLANNER_KINDS: frozenset[str] = frozenset({"scripted", "surrogate", "llm"})
_PLANNERS_BY_KIND: dict[str, type[BaseModel]] = {
    "scripted": ScriptedPlannerSpec,
    "surrogate": SurrogatePlannerSpec,
    "llm": LLMPlannerSpec,
}
_PLANNER_UNION = object()  # where a field path enters the planner (its kind comes next)


class ApprovalsSpec(_Strict):
    """Who may approve, and what happens when nobody answers."""

    approvers: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default_factory=list,
        max_length=100,
        description="People allowed to approve, for rules that name none of their own.",
    )
    timeout_minutes: Number = Field(
        default=24 * 60.0, gt=0, le=30 * 24 * 60, description="How long a request waits."
    )
    on_timeout: Literal["fallback", "stop"] = Field(
        default="stop",
        description='"fallback": run the deterministic fallback batch; "stop": end the run.',
    )
    max_batch_override: bool = Field(
        default=True, description="Whether an approver may shrink the batch when approving."
    )
    allocation_margin_minutes: Number = Field(
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
    seed: StrictInt = Field(
        default=0, ge=0, le=2**63 - 1, description="Seed of every random choice."
    )
    rounds: StrictInt = Field(ge=1, le=10_000, description="How many rounds to run.")
    batch_size: StrictInt = Field(ge=1, le=100_000, description="Candidates per batch.")
    attempts: StrictInt = Field(
        default=1, ge=1, le=50, description="The gate's attempt budget per call."
    )
    policy_retries: StrictInt = Field(
        default=1, ge=0, le=20, description="Gate calls added in a round after a policy Retry."
    )
    budget_node_hours: Number = Field(
        gt=0, le=1e9, description="Node-hours the campaign may spend."
    )
    objective: ObjectiveSpec
    planner: PlannerSpec
    policy: str | None = Field(
        default=None, description="A policy TOML file, relative to the spec file. None: no rules."
    )
    allow_no_rules: bool = Field(
        default=False,
        description=(
            "Run with no policy rules (no policy file, or one without [[rules]]): then only the "
            "budget and the round count stop the campaign and nothing asks a human. Off by "
            "default, so a forgotten or empty policy file is refused before anything runs."
        ),
    )
    approvals: ApprovalsSpec = Field(default_factory=ApprovalsSpec)
    notify: NotifyConfig | None = Field(
        default=None, description="Notifications for this campaign; replaces the site's."
    )
    site: str = Field(
        default="local",
        description="The site config: a name (site-configs/<name>.toml) or a path, "
        "relative to the spec file.",
    )

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
        return candidate if candidate.is_absolute() else absolute(self.directory / candidate)

    def site_location(self) -> str:
        """Return the spec's site: a name as written, a path resolved against the spec's folder."""
        site = self.spec.site
        return str(self.resolve(site)) if is_site_path(site) else site


def is_site_path(site: str) -> bool:
    """Return whether a site is given as a file path rather than a name."""
    return site.endswith(".toml") or "/" in site


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a campaign: the file, the dotted field, and the line to show."""

    file: str
    field: str | None
    text: str

    @classmethod
    def at(cls, file: str, field: str | None, message: str) -> Problem:
        """Return a problem whose line names ``file`` and ``field`` before ``message``."""
        where = f"{file}: field '{field}'" if field else file
        return cls(file, field, f"{where}: {message}")


def problems_error(
    problems: Sequence[Problem], kind: type[UnattendedError] = SpecInvalid
) -> UnattendedError:
    """Return one error that lists every problem (one line; the first one's file and field)."""
    first = problems[0]
    message = (
        first.text
        if len(problems) == 1
        else f"{len(problems)} problems: " + "; ".join(p.text for p in problems)
    )
    return kind(
        message,
        details={
            "file": first.file,
            "field": first.field,
            "problems": [{"file": p.file, "field": p.field} for p in problems],
        },
    )


def _field_of(error: Mapping[str, Any]) -> str:
    """Return the dotted field of a validation error, without pydantic's union/validator tags."""
    loc = [str(p) for p in error.get("loc", ())]
    if loc[:1] == ["planner"] and len(loc) > 1 and loc[1] in PLANNER_KINDS:
        del loc[1]  # the discriminated union's tag, not a field
    parts = [p for p in loc if re.fullmatch(r"\w+", p)]
    if error.get("type") in {"union_tag_invalid", "union_tag_not_found"}:
        parts.append(str(error.get("ctx", {}).get("discriminator", "kind")).strip("'"))
    return ".".join(parts) or "(top level)"


def _validation_problems(exc: ValidationError, source: str) -> list[Problem]:
    errors = exc.errors(include_url=False, include_input=False)
    missing = {_field_of(e) for e in errors if e.get("type") == "missing"}
    meant: set[str] = set()  # missing fields a typo stands for: said once, on the typo
    problems: dict[str, Problem] = {}
    for error in errors:
        field = _field_of(error)
        message = _message_of(error).removeprefix("Value error, ")
        if error.get("type") == "extra_forbidden":
            nearest = _nearest_field(error)
            if nearest is not None:
                parent = field.rpartition(".")[0]
                meant.add(f"{parent}.{nearest}" if parent else nearest)
                message = f"not a known field; did you mean `{nearest}`?"
        # A union (simulation: "demo" or an argv) fails once per member: keep the first.
        problems.setdefault(field, Problem.at(source, field, message))
    return [p for f, p in problems.items() if not (f in meant and f in missing)]


def _nearest_field(error: Mapping[str, Any]) -> str | None:
    """Return the known field nearest to an unknown one's name (difflib), if one is near."""
    import difflib

    loc = [str(p) for p in error.get("loc", ())]
    model: Any = CampaignSpec
    for part in loc[:-1]:
        if model is None:
            return None
        if part in _PLANNERS_BY_KIND and model is _PLANNER_UNION:
            model = _PLANNERS_BY_KIND[part]
            continue
        field = model.model_fields.get(part)
        model = _model_of(field.annotation) if field is not None else None
    if model is None or model is _PLANNER_UNION:
        return None
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return close[0] if close else None


def _model_of(annotation: Any) -> Any:
    """Return the model a field holds (``X | None`` is X; the planner union stays a union)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if annotation == PlannerSpec:
        return _PLANNER_UNION
    models = [a for a in typing.get_args(annotation) if isinstance(a, type)]
    models = [a for a in models if issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


def _message_of(error: Mapping[str, Any]) -> str:
    """Return what was wrong, saying which planner kind a stray planner field does not fit."""
    loc = [str(p) for p in error.get("loc", ())]
    if error.get("type") == "extra_forbidden" and loc[:1] == ["planner"] and len(loc) > 2:
        return f"not a field of the {loc[1]} planner"
    return str(error.get("msg", "invalid"))


def spec_from_dict(data: dict[str, Any], *, source: str = "<spec>") -> CampaignSpec:
    """Validate ``data`` as a campaign spec; raise ``SpecInvalid`` naming the source and fields."""
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise problems_error(_validation_problems(exc, source)) from None


def load_campaign(path: str | Path, *, named_files: bool = True) -> LoadedSpec:
    """Read and validate a campaign spec file, and every file it names.

    ``named_files=False`` validates the spec's own fields only: for readers of a
    campaign submitted already (``status <id>``, ``approvals``), whose transcript
    and policy were checked and pinned at submission; it loads neither the
    planners nor the policy engine.

    Raises:
        SpecInvalid: The file is missing, is not TOML, or a field is wrong; or a
            file it names (transcript, policy) is missing or invalid. The message
            lists every problem found, each naming the file and the field.
    """
    loaded, problems = read_campaign(path, named_files=named_files)
    if problems or loaded is None:
        raise problems_error(problems)
    return loaded


def read_campaign(
    path: str | Path, *, named_files: bool = True
) -> tuple[LoadedSpec | None, list[Problem]]:
    """Read a campaign spec and the files it names; return it and every problem found.

    The spec is returned when its own fields validate, even if a file it names is
    wrong, so a caller can go on checking the rest.
    """
    file = absolute(Path(path))
    source = str(file)
    why = file_problem(file, max_bytes=MAX_SPEC_BYTES)
    if why is not None:
        return None, [Problem.at(source, None, why)]
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem.at(source, None, f"cannot read the file ({type(exc).__name__})")]
    except tomllib.TOMLDecodeError as exc:
        return None, [Problem.at(source, None, f"not valid TOML ({exc})")]
    problems: list[Problem] = []
    loaded = None
    try:
        spec = CampaignSpec.model_validate(raw)
        loaded = LoadedSpec(spec=spec, path=file, raw=notify_secrets_masked(raw))
    except ValidationError as exc:
        problems += _validation_problems(exc, source)
    if not named_files:
        return loaded, problems
    # The named files are checked even when a field is wrong, so one pass shows everything.
    planner = raw.get("planner")
    transcript = planner.get("transcript") if isinstance(planner, dict) else None
    if isinstance(transcript, str):
        problems += _transcript_problems(file, transcript)
    policy = raw.get("policy")
    if isinstance(policy, str):
        problems += _policy_problems(file, policy)
    return loaded, problems


def _named(spec_file: Path, relative: str) -> Path:
    candidate = Path(relative).expanduser()
    return candidate if candidate.is_absolute() else absolute(spec_file.parent / candidate)


def _transcript_problems(spec_file: Path, relative: str) -> list[Problem]:
    """Fail at load time, not mid-campaign, when the transcript is missing, empty or invalid."""
    source, field = str(spec_file), "planner.transcript"
    transcript = _named(spec_file, relative)
    why = file_problem(transcript)
    if why is not None:
        return [Problem.at(source, field, f"{transcript}: {why}")]
    from tasks import ScriptedPlanner

    try:
        planner = ScriptedPlanner(transcript)  # a bad line would otherwise fail mid-campaign
    except SpecInvalid as exc:
        return [Problem.at(source, field, exc.message)]
    if len(planner) == 0:
        return [Problem.at(source, field, f"{transcript}: the transcript has no answers")]
    return []


def _policy_problems(spec_file: Path, relative: str) -> list[Problem]:
    """Return why the policy file the spec names cannot be used, if it cannot."""
    from policies import load_policy

    source = str(spec_file)
    policy_file = _named(spec_file, relative)
    why = file_problem(policy_file)
    if why is not None:
        return [Problem.at(source, "policy", f"{policy_file}: {why}")]
    try:
        load_policy(policy_file)
    except SpecInvalid as exc:  # it names the policy file, the rule and the field
        return [Problem(str(policy_file), exc.details.get("field") or "policy", exc.message)]
    return []
