"""Rules: a named condition on the round context, with a severity.

A condition is a Python callable or a CEL expression. CEL expressions are
compiled once, checked against the known variables and fields, and run once
against sample contexts when the rule is built, so a typo or an expression
that does not yield a bool fails at load and never in the middle of a campaign.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from policies._context import (
    CANDIDATE_FIELDS,
    CEL_FIELDS,
    CandidateView,
    RoundContext,
    candidate_variables,
    cel_variables,
    sample_candidates,
    sample_contexts,
)
from policies._errors import SpecInvalid

if TYPE_CHECKING:
    import cel


def cel_module() -> Any:
    """Import the CEL bindings on first use.

    The ``cel`` package also imports its command line (prompt_toolkit) when loaded,
    about 0.3 s that every ``unattended`` command would otherwise pay.
    """
    import cel

    return cel


Condition: TypeAlias = Callable[[RoundContext], bool | str | None]


class Severity(StrEnum):
    """What a fired rule does, strongest first (the order decides ties between rules)."""

    HARD_STOP = "HARD_STOP"
    PERSISTENT_BLOCK = "PERSISTENT_BLOCK"
    ASK = "ASK"
    SOFT_BLOCK = "SOFT_BLOCK"
    BLOCK_AND_WARN = "BLOCK_AND_WARN"
    TOLERATE = "TOLERATE"

    @property
    def strength(self) -> int:
        """Return how strong the severity is (higher decides)."""
        return _STRENGTH[self]


# PERSISTENT_BLOCK outranks ASK: asking a human to approve a proposal that a
# never-overridable rule refuses anyway would waste the human's time.
_STRENGTH: Final[dict[Severity, int]] = {
    severity: len(Severity) - position for position, severity in enumerate(Severity)
}


class SoftBlockMode(StrEnum):
    """How SOFT_BLOCK refusals are counted towards escalation."""

    CUMULATIVE = "cumulative"
    CONSECUTIVE = "consecutive"
    HYBRID = "hybrid"


_STRING_LITERAL: Final = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'""")
_BOUND_NAME: Final = re.compile(
    r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,"
)
Scope: TypeAlias = Literal["round", "candidate"]
# A candidate-scoped rule reads the round's maps and the candidate it judges.
_FIELDS: Final[dict[str, dict[str, frozenset[str]]]] = {
    "round": CEL_FIELDS,
    "candidate": {**CEL_FIELDS, "candidate": CANDIDATE_FIELDS},
}


def _field_access(fields: dict[str, frozenset[str]]) -> re.Pattern[str]:
    return re.compile(r"(?<![\w.])(" + "|".join(fields) + r")\s*\.\s*([A-Za-z_]\w*)")


_FIELD_ACCESS: Final = {scope: _field_access(fields) for scope, fields in _FIELDS.items()}
# Any use of ``batch`` other than its two scalar fields may reach the candidates.
_MAY_READ_CANDIDATES: Final = re.compile(r"(?<![\w.])batch(?!\s*\.\s*(?:size|node_hours)\b)")


def _spec_error(rule: str, field_name: str, problem: str) -> SpecInvalid:
    return SpecInvalid(
        f"rule {rule!r}: field {field_name!r}: {problem}",
        details={"rule": rule, "field": field_name, "problem": problem},
    )


_PARSE_POSITION: Final = re.compile(r"<input>:(\d+):(\d+): ([^\n|]*)")


def _syntax(exc: Exception) -> str:
    """Return where and why an expression failed to parse, without repeating it."""
    found = _PARSE_POSITION.search(str(exc))
    if found is None:
        return _first_line(str(exc))
    line, column, why = found.groups()
    return f"line {line}, column {column}: {why.strip()[:120]}"


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]


@dataclass(frozen=True, slots=True)
class CompiledExpression:
    """A CEL expression compiled and checked at load time."""

    source: str
    program: Any
    paths: tuple[str, ...]
    reads_candidates: bool

    @classmethod
    def compile(cls, rule: str, source: str, scope: Scope = "round") -> CompiledExpression:
        """Compile ``source`` for ``rule``, or raise :class:`SpecInvalid` naming the problem."""
        fields = _FIELDS[scope]
        if not source.strip():
            raise _spec_error(rule, "when", "the expression is empty")
        try:
            program = cel_module().compile(source)
        except Exception as exc:  # noqa: BLE001  # the binding raises several types for bad syntax
            raise _spec_error(
                rule, "when", f"not a valid CEL expression ({_syntax(exc)})"
            ) from None
        code = _STRING_LITERAL.sub('""', source)
        bound = set(_BOUND_NAME.findall(code))
        unknown = sorted(set(program.variables()) - set(fields) - bound)
        if unknown:
            known = ", ".join(sorted(fields))
            raise _spec_error(rule, "when", f"unknown variable {unknown[0]!r} (known: {known})")
        paths: dict[str, None] = {}
        for top, name in _FIELD_ACCESS[scope].findall(code):
            if name not in fields[top]:
                known = ", ".join(sorted(fields[top]))
                raise _spec_error(rule, "when", f"unknown field '{top}.{name}' (known: {known})")
            paths.setdefault(f"{top}.{name}", None)
        compiled = cls(source, program, tuple(paths), bool(_MAY_READ_CANDIDATES.search(code)))
        samples = [cel_variables(sample) for sample in sample_contexts()]
        if scope == "candidate":
            samples = [
                {**variables, "candidate": candidate_variables(candidate)}
                for variables in samples
                for candidate in sample_candidates()
            ]
        for sample in samples:
            try:
                result = program.execute(cel_module().Context(sample))
            except Exception as exc:  # noqa: BLE001  # any failure on a sample is a load error
                raise _spec_error(
                    rule,
                    "when",
                    f"failed on a sample round ({type(exc).__name__}: {_first_line(str(exc))})",
                ) from None
            if not isinstance(result, bool):
                raise _spec_error(rule, "when", f"must yield a bool, got {type(result).__name__}")
        return compiled


def _scalar(ctx: RoundContext, path: str) -> float | int | bool | None:
    """Return the number a CEL path reads, or ``None`` for lists and text."""
    values: dict[str, float | int | bool | None] = {
        "allocation.walltime_remaining": ctx.walltime_remaining,
        "allocation.has_walltime": ctx.walltime_remaining is not None,
        "batch.size": ctx.batch.size,
        "batch.node_hours": ctx.batch.node_hours,
        "budget.spent": ctx.budget_spent,
        "budget.remaining": ctx.budget_remaining,
        "gate.consecutive_fallbacks": ctx.consecutive_fallbacks,
        "round.index": ctx.round_index,
        "round.attempt": ctx.attempt,
    }
    return values.get(path)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """A named condition with a severity; it fires when the condition holds.

    Args:
        name: Unique within a policy; names the rule in decisions and errors.
        when: A CEL expression over ``round``, ``batch``, ``gate``, ``budget``,
            ``allocation``, ``history`` and ``campaign``, or a callable taking the
            :class:`RoundContext` and returning ``True``/a non-empty detail string
            (fired) or ``False``/``None``/``""`` (not fired).
        severity: What firing does (see :class:`Severity`).
        description: What the rule protects.
        advice: How a proposal can comply; goes into the agent's feedback.
        approvers: Who may approve, for ASK (and SOFT_BLOCK escalating to ASK).
        require_proof: An approver must prove who they are (a one-time code of
            their own) for the answer to count; ASK and SOFT_BLOCK rules only.
        log_only: Shadow mode: report what the rule would do, never act on it.
        scope: ``round`` judges the whole proposal; ``candidate`` judges each
            candidate (``candidate.x``, ``candidate.index``, ``candidate.prediction``)
            and refuses the ones it fires on; such a rule is HARD_STOP.

    Raises:
        SpecInvalid: The name is empty or the CEL expression is invalid.
    """

    name: str
    when: str | Condition
    severity: Severity = Severity.HARD_STOP
    description: str = ""
    advice: str = ""
    approvers: tuple[str, ...] = ()
    require_proof: bool = False
    log_only: bool = False
    scope: Scope = "round"
    expression: CompiledExpression | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise _spec_error(self.name, "name", "a rule needs a non-empty name")
        try:
            severity = Severity(self.severity)
        except ValueError:
            choices = ", ".join(s.value for s in Severity)
            raise _spec_error(
                self.name, "severity", f"unknown severity (choose one of {choices})"
            ) from None
        # The dataclass is frozen; normalising inputs once here is its constructor's job.
        object.__setattr__(self, "severity", severity)
        object.__setattr__(self, "approvers", tuple(self.approvers))
        if self.require_proof and severity not in (Severity.ASK, Severity.SOFT_BLOCK):
            raise _spec_error(
                self.name,
                "require_proof",
                "only a rule that can ask for approval (ASK, SOFT_BLOCK) can require proof",
            )
        if self.scope not in _FIELDS:
            raise _spec_error(self.name, "scope", "unknown scope (choose round or candidate)")
        if self.scope == "candidate" and severity is not Severity.HARD_STOP:
            raise _spec_error(
                self.name,
                "severity",
                "a candidate rule refuses the candidates it fires on: its severity is HARD_STOP",
            )
        expression = None
        if isinstance(self.when, str):
            expression = CompiledExpression.compile(self.name, self.when, self.scope)
        elif not callable(self.when):
            raise _spec_error(self.name, "when", "must be a CEL string or a callable")
        object.__setattr__(self, "expression", expression)

    @property
    def reads_candidates(self) -> bool:
        """Return whether the condition may read ``batch.candidates``."""
        return self.expression is None or self.expression.reads_candidates

    def check(self, ctx: RoundContext, variables: cel.Context | None) -> str | None:
        """Return what broke the rule if it fires on ``ctx``, else ``None``.

        A condition that raises, or yields something other than a bool or a
        string, fires (fail closed): an unattended run must not go on because a
        rule could not be checked. Only the exception's type is reported, since
        its text may quote the proposal.
        """
        try:
            if self.expression is not None:
                result: object = self.expression.program.execute(variables)
            else:
                assert not isinstance(self.when, str)  # narrowed by __post_init__
                result = self.when(ctx)
        except Exception as exc:  # noqa: BLE001  # fail closed on any condition failure
            return f"the condition could not be checked ({type(exc).__name__}); failing closed"
        if result is None or result is False or result == "":
            return None
        if result is True:
            return self._cel_detail(ctx) if self.expression is not None else "condition held"
        if isinstance(result, str):
            return result
        return f"the condition yielded a {type(result).__name__}, not a bool; failing closed"

    def check_candidate(self, candidate: CandidateView, variables: dict[str, Any]) -> str | None:
        """Return why this candidate-scoped rule refuses ``candidate``, else ``None``.

        ``variables`` are the round's CEL maps; a condition that fails refuses (fail closed).
        A callable condition takes the :class:`CandidateView`.
        """
        try:
            if self.expression is not None:
                context = cel_module().Context(
                    {**variables, "candidate": candidate_variables(candidate)}
                )
                result: object = self.expression.program.execute(context)
            else:
                assert not isinstance(self.when, str)  # narrowed by __post_init__
                result = self.when(candidate)  # type: ignore[arg-type]  # a candidate callable
        except Exception as exc:  # noqa: BLE001  # fail closed on any condition failure
            return f"the condition could not be checked ({type(exc).__name__}); failing closed"
        if result is None or result is False or result == "":
            return None
        if result is True:
            if self.expression is None:
                return "condition held"
            held = f"`{self.expression.source}` held for candidate {candidate.index}"
            if candidate.prediction is not None and "candidate.prediction" in self.expression.paths:
                held += f" (candidate.prediction={candidate.prediction:.6g})"
            return held
        return result if isinstance(result, str) else "the condition did not yield a bool"

    def _cel_detail(self, ctx: RoundContext) -> str:
        assert self.expression is not None
        shown = []
        for path in self.expression.paths:
            value = _scalar(ctx, path)
            if value is not None:
                shown.append(f"{path}={value}")
        held = f"`{self.expression.source}` held"
        return f"{held} ({', '.join(shown)})" if shown else held
