"""Load a policy from a TOML file or a campaign spec's embedded table.

Everything is checked at load: unknown fields, severities, CEL expressions
(compiled and tried on sample rounds), duplicate names. Every problem raises
:class:`SpecInvalid` whose message names the file, the rule and the field,
and whose ``details`` carry ``file``, ``rule`` and ``field``. Messages never
quote the values found in the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policies._errors import SpecInvalid
from policies._policy import Policy
from policies._rules import Rule, Severity, SoftBlockMode


class _RuleSpec(BaseModel):
    """One ``[[rules]]`` table."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="Unique rule name.")
    description: str = Field(default="", max_length=2000, description="What the rule guards.")
    advice: str = Field(default="", max_length=2000, description="How a proposal complies.")
    severity: Severity = Field(description="What firing does.")
    when: str = Field(min_length=1, max_length=4000, description="CEL condition (a bool).")
    approvers: list[str] = Field(default_factory=list, description="Who may approve (ASK).")
    require_proof: bool = Field(
        default=False,
        description="Approvers must enter their one-time code (ASK, SOFT_BLOCK).",
    )
    log_only: bool = Field(default=False, description="Shadow mode for this rule.")
    scope: Literal["round", "candidate"] = Field(
        default="round", description="Judge the whole batch, or each candidate."
    )


class _PolicySettings(BaseModel):
    """The ``[policy]`` table."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="policy", min_length=1, max_length=200, description="Policy name.")
    max_soft_attempts: int = Field(
        default=3, ge=1, le=10_000, description="SOFT_BLOCK refusals that escalate."
    )
    soft_block_mode: SoftBlockMode = Field(
        default=SoftBlockMode.CUMULATIVE, description="How SOFT_BLOCK refusals are counted."
    )
    max_consecutive_soft_attempts: int | None = Field(
        default=None, ge=1, le=10_000, description="Consecutive threshold (default: cumulative)."
    )
    escalate_to: Literal["HARD_STOP", "ASK"] = Field(
        default="HARD_STOP", description="What an exhausted SOFT_BLOCK becomes."
    )
    latch_stop: bool = Field(default=False, description="Refuse every round after a HARD_STOP.")
    log_only: bool = Field(default=False, description="Shadow mode for every rule.")
    top_up_from_fallback: bool = Field(
        default=False, description="Fill a batch thinned by candidate rules from the fallback."
    )


class _PolicyFile(BaseModel):
    """A whole policy file."""

    model_config = ConfigDict(extra="forbid")

    policy: _PolicySettings = Field(default_factory=_PolicySettings)
    rules: list[_RuleSpec] = Field(default_factory=list)


def _fail(source: str, rule: str | None, field: str | None, problem: str) -> SpecInvalid:
    where = f"{source}: "
    if rule is not None:
        where += f"rule {rule!r}: "
    if field is not None:
        where += f"field {field!r}: "
    return SpecInvalid(where + problem, details={"file": source, "rule": rule, "field": field})


def _rule_name(rules: object, index: int) -> str:
    """Name a rule in an error: its name if it has a usable one, else its position."""
    if isinstance(rules, list) and index < len(rules) and isinstance(rules[index], Mapping):
        name = rules[index].get("name")
        if isinstance(name, str) and name.strip():
            return name
    return f"#{index + 1}"


def _from_validation(source: str, data: Mapping[str, Any], exc: ValidationError) -> SpecInvalid:
    """Turn the first pydantic error into a SpecInvalid naming rule and field only."""
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    # error["msg"] describes the expected type or the rule broken; the offending
    # value stays out (it is in error["input"], which is never used).
    problem = str(error["msg"])
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        rule = _rule_name(data.get("rules"), loc[1])
        field = ".".join(str(p) for p in loc[2:]) or None
        return _fail(source, rule, field, problem)
    if loc and loc[0] == "policy":
        field = ".".join(str(p) for p in loc[1:]) or "policy"
        return _fail(source, None, field, problem)
    return _fail(source, None, ".".join(str(p) for p in loc) or None, problem)


def policy_from_dict(data: Mapping[str, Any], *, source: str = "<policy>") -> Policy:
    """Build a policy from parsed data, checking everything a file load checks.

    ``data`` has the file's shape (a ``policy`` table and a ``rules`` list), or
    the settings and ``rules`` side by side, as a campaign spec embeds them
    under its own ``[policy]`` table.

    Args:
        data: The parsed policy.
        source: Names where the data came from in errors (a file path, or
            ``campaign.toml [policy]``).

    Raises:
        SpecInvalid: Anything is wrong; ``details`` name ``file``, ``rule``, ``field``.
    """
    if not isinstance(data, Mapping):
        raise _fail(source, None, None, "a policy must be a table")
    raw = dict(data)
    if "policy" not in raw:
        raw = {
            "policy": {k: v for k, v in raw.items() if k != "rules"},
            "rules": raw.get("rules", []),
        }
    try:
        spec = _PolicyFile.model_validate(raw)
    except ValidationError as exc:
        raise _from_validation(source, raw, exc) from None
    rules: list[Rule] = []
    seen: set[str] = set()
    for rule_spec in spec.rules:
        if rule_spec.name in seen:
            raise _fail(source, rule_spec.name, "name", "duplicate rule name")
        seen.add(rule_spec.name)
        try:
            rules.append(
                Rule(
                    name=rule_spec.name,
                    when=rule_spec.when,
                    severity=rule_spec.severity,
                    description=rule_spec.description,
                    advice=rule_spec.advice,
                    approvers=tuple(rule_spec.approvers),
                    require_proof=rule_spec.require_proof,
                    log_only=rule_spec.log_only,
                    scope=rule_spec.scope,
                )
            )
        except SpecInvalid as exc:
            field = exc.details.get("field")
            raise _fail(source, rule_spec.name, field, _problem(exc)) from None
    settings = spec.policy
    try:
        return Policy(
            rules,
            name=settings.name,
            max_soft_attempts=settings.max_soft_attempts,
            soft_block_mode=settings.soft_block_mode,
            max_consecutive_soft_attempts=settings.max_consecutive_soft_attempts,
            escalate_to=settings.escalate_to,
            latch_stop=settings.latch_stop,
            log_only=settings.log_only,
            top_up_from_fallback=settings.top_up_from_fallback,
        )
    except SpecInvalid as exc:
        details = exc.details
        raise _fail(source, details.get("rule"), details.get("field"), _problem(exc)) from None


def _problem(exc: SpecInvalid) -> str:
    """Return the problem alone, without the rule and field a lower layer put in front."""
    return str(exc.details.get("problem", exc.message))


def load_policy(path: str | PathLike[str]) -> Policy:
    """Read, check and build the policy in the TOML file at ``path``.

    Raises:
        SpecInvalid: The file is missing, unreadable, not TOML, or invalid;
            ``details`` name ``file``, ``rule`` and ``field``.
    """
    source = str(path)
    try:
        with Path(path).open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise _fail(source, None, None, "policy file not found") from None
    except OSError as exc:
        raise _fail(source, None, None, f"cannot read the file ({type(exc).__name__})") from None
    except UnicodeDecodeError:
        raise _fail(source, None, None, "the file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        # The parser's message gives the position, e.g. "(at line 3, column 5)".
        raise _fail(source, None, None, f"not valid TOML: {exc}") from None
    return policy_from_dict(data, source=source)
