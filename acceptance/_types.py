"""The gate's records and its two exceptions.

``Rejected`` is how a producer or a check says "not acceptable"; it is not a
failure. An attempt whose check failed (raised anything else) is recorded with
``failed_by``, never as a rejection. ``NotAccepted`` is raised when the attempts
run out and there is no fallback. ``Attempt`` and ``Outcome`` are immutable and
serialise to JSON, since they are stored as provenance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

T = TypeVar("T")

Disposition = Literal["accepted", "fallback"]


class Rejected(Exception):  # noqa: N818  # the contract's name: a rejection, not an error
    """Raised by a producer or a check: the value is not acceptable.

    Args:
        reason: What is wrong, phrased so the producer can act on it. It is
            recorded and may be shown to the agent, so keep secrets out of it.
        check: The stage that rejected (``"schema"``, ``"refusal"``,
            ``"truncation"``, ...). Checks may leave it out: their name is used.
        details: What the check did to decide, recorded on its verdict (JSON
            values; e.g. the verifier's tasks and their batch jobs).
    """

    def __init__(
        self, reason: str, *, check: str | None = None, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.check = check
        self.details = details


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one check (or the producer's own stage) said about one value.

    A plain frozen dataclass rather than a model: the gate builds one per check on
    its hot path, and pydantic still validates and serialises it inside ``Attempt``.
    """

    check: str
    """The check's name, or the stage the producer named."""
    passed: bool
    reason: str | None
    """Why it rejected; None on a pass."""
    duration: float
    """Seconds the check took."""
    details: Mapping[str, Any] | None = None
    """What the check did to decide (the mapping a check returns, or ``Rejected.details``)."""


class Attempt(BaseModel, Generic[T]):
    """One call of the producer and what the checks made of its value."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, ser_json_inf_nan="strings")

    number: int = Field(ge=1, description="1 for the first attempt.")
    value: SerializeAsAny[T] | None = Field(
        default=None, description="The produced value; None when the producer rejected it."
    )
    rejected_by: str | None = Field(
        default=None, description="The check or stage; None if accepted."
    )
    failed_by: str | None = Field(
        default=None,
        description="The check that failed (raised an error, not a rejection); None otherwise.",
    )
    reason: str | None = Field(
        default=None, description="Why it was rejected or failed; None if accepted."
    )
    scores: dict[str, float] = Field(
        default_factory=dict, description="Soft signals, recorded and never gating."
    )
    verdicts: tuple[Verdict, ...] = Field(default=(), description="Every check that ran, in order.")
    duration: float = Field(ge=0.0, description="Seconds for the producer, checks and scores.")
    trace_id: str | None = Field(default=None, description="Hex trace id of the attempt's span.")
    span_id: str | None = Field(default=None, description="Hex span id of the attempt's span.")

    @property
    def accepted(self) -> bool:
        """True when no check or stage rejected the value and none failed."""
        return self.rejected_by is None and self.failed_by is None


class Outcome(BaseModel, Generic[T]):
    """The gate's answer: the value to use and how it was reached."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, ser_json_inf_nan="strings")

    value: SerializeAsAny[T]
    disposition: Disposition
    attempts: tuple[Attempt[T], ...]


class NotAccepted(Exception):  # noqa: N818  # the contract's name
    """Every attempt was rejected and there was no fallback.

    ``attempts`` holds every attempt, in order. The message names the gate and
    the last stage that rejected; it never holds a value.
    """

    def __init__(self, name: str, attempts: tuple[Attempt[Any], ...]) -> None:
        last = attempts[-1].rejected_by if attempts else None
        super().__init__(
            f"gate {name!r}: no value accepted in {len(attempts)} attempt(s); "
            f"last rejected by {last!r}"
        )
        self.name = name
        self.attempts = attempts
