"""A planner's proposal, the box it must fall in, and the cheap checks on it.

The checks run first in the accept gate, cheapest first. Each raises
``acceptance.Rejected`` with a reason a planner can act on; a reason names
positions (candidate and coordinate indices) and numbers, never free text from
the proposal itself.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from acceptance import Rejected

#: Digits a candidate is rounded to when deciding whether two are the same.
DISTINCT_DIGITS = 10
#: Hard caps that keep a hostile answer from costing more than a rejection.
MAX_CANDIDATES = 4096
MAX_DIM = 256
MAX_RATIONALE = 8000
#: How many offending positions a reason lists before summarising the rest.
_LISTED = 5

Check = Callable[[Any], None]


class Bounds(BaseModel):
    """The box candidates must lie in: ``lower[i] <= x[i] <= upper[i]``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lower: tuple[float, ...] = Field(min_length=1, max_length=MAX_DIM, description="Lower corner.")
    upper: tuple[float, ...] = Field(min_length=1, max_length=MAX_DIM, description="Upper corner.")

    @model_validator(mode="after")
    def _consistent(self) -> Bounds:
        if len(self.lower) != len(self.upper):
            raise ValueError(
                f"lower has {len(self.lower)} coordinates and upper has {len(self.upper)}"
            )
        for index, (low, high) in enumerate(zip(self.lower, self.upper, strict=True)):
            if not (math.isfinite(low) and math.isfinite(high)):
                raise ValueError(f"coordinate {index}: bounds must be finite")
            if not low < high:
                raise ValueError(f"coordinate {index}: lower {low!r} is not below upper {high!r}")
        return self

    @property
    def dim(self) -> int:
        """Return the number of coordinates of a candidate."""
        return len(self.lower)

    @classmethod
    def unit(cls, dim: int) -> Bounds:
        """Return the unit box ``[0, 1]^dim``."""
        return cls(lower=(0.0,) * dim, upper=(1.0,) * dim)


class Proposal(BaseModel):
    """A batch of candidates and the reasoning behind it.

    ``rationale`` comes first so that a model writing JSON in field order
    reasons before it answers. ``response_id`` is set by the planner from the
    provider's response id; it is not part of the schema the model sees.
    """

    # JSON has no NaN: keep a rejected NaN candidate as "NaN" in the provenance, not null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    rationale: str = Field(
        max_length=MAX_RATIONALE,
        description="Why these candidates: reasoning written before choosing them.",
    )
    candidates: list[Annotated[list[float], Field(max_length=MAX_DIM)]] = Field(
        max_length=MAX_CANDIDATES,
        description="The batch: one list of coordinates per candidate.",
    )
    response_id: SkipJsonSchema[str | None] = Field(
        default=None, description="The provider's response id, when a model produced it."
    )

    @classmethod
    def answer_schema(cls, *, count: int | None = None, dim: int | None = None) -> dict[str, Any]:
        """Return the JSON schema a model's answer must follow (strict structured output).

        Every property is required and no other is allowed, as strict mode asks.
        With ``count`` and ``dim`` the array sizes are pinned, so a server that
        enforces the schema by grammar (vLLM) cannot emit a wrong shape.
        """
        schema = cls.model_json_schema()
        # The class docstring is for programmers; the model gets its own words.
        schema["description"] = "Reason first in rationale, then give the batch of candidates."
        schema["required"] = list(schema["properties"])
        schema["additionalProperties"] = False
        candidates = schema["properties"]["candidates"]
        if count is not None:
            candidates["minItems"] = candidates["maxItems"] = count
        if dim is not None:
            candidates["items"]["minItems"] = candidates["items"]["maxItems"] = dim
        return schema

    def answer(self) -> dict[str, Any]:
        """Return the fields a model wrote (no ``response_id``), as JSON-ready data."""
        return {"rationale": self.rationale, "candidates": self.candidates}


def candidates_hash(candidates: Sequence[Sequence[float]]) -> str:
    """Return the sha256 hex digest of the candidates' canonical JSON.

    Raises:
        ValueError: A coordinate is NaN or infinite (it has no canonical JSON).
    """
    plain = [[float(value) for value in candidate] for candidate in candidates]
    text = json.dumps(plain, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _candidates_of(value: Any) -> list[Any]:
    """Return the candidate list of a ``Proposal`` or of a plain sequence."""
    candidates = value.candidates if isinstance(value, Proposal) else value
    return list(candidates)


def _listed(items: list[str], total: int) -> str:
    """Join the first offending positions and say how many more there are."""
    text = "; ".join(items[:_LISTED])
    if total > _LISTED:
        text += f"; and {total - _LISTED} more"
    return text


def planner_checks(bounds: Bounds, count: int) -> list[Check]:
    """Return the cheap checks for a batch of ``count`` candidates in ``bounds``, cheapest first.

    Each takes a ``Proposal`` (or a plain list of candidates) and raises
    ``acceptance.Rejected`` naming positions and numbers: ``batch_size``,
    ``finite``, ``dimensions``, ``within_bounds``, ``distinct``.
    """
    dim = bounds.dim

    def batch_size(value: Any) -> None:
        got = len(_candidates_of(value))
        if got != count:
            raise Rejected(f"{got} candidates; the batch takes exactly {count}")

    def finite(value: Any) -> None:
        bad = [
            f"candidate {i} coordinate {j} is {coordinate!r}"
            for i, candidate in enumerate(_candidates_of(value))
            for j, coordinate in enumerate(candidate)
            if not math.isfinite(coordinate)
        ]
        if bad:
            raise Rejected("not finite: " + _listed(bad, len(bad)))

    def dimensions(value: Any) -> None:
        bad = [
            f"candidate {i} has {len(candidate)}"
            for i, candidate in enumerate(_candidates_of(value))
            if len(candidate) != dim
        ]
        if bad:
            raise Rejected(
                f"each candidate takes exactly {dim} coordinates: " + _listed(bad, len(bad))
            )

    def within_bounds(value: Any) -> None:
        # A NaN fails both comparisons, so it lies outside too.
        bad = [
            f"candidate {i} coordinate {j} = {coordinate!r} outside "
            f"[{bounds.lower[j]!r}, {bounds.upper[j]!r}]"
            for i, candidate in enumerate(_candidates_of(value))
            for j, coordinate in enumerate(candidate[:dim])
            if not bounds.lower[j] <= coordinate <= bounds.upper[j]
        ]
        if bad:
            raise Rejected(_listed(bad, len(bad)))

    def distinct(value: Any) -> None:
        first: dict[tuple[float, ...], int] = {}
        repeats: list[str] = []
        for i, candidate in enumerate(_candidates_of(value)):
            key = tuple(round(coordinate, DISTINCT_DIGITS) for coordinate in candidate)
            if key in first:
                repeats.append(f"candidate {i} repeats candidate {first[key]}")
            else:
                first[key] = i
        if repeats:
            raise Rejected(
                f"the batch repeats candidates (rounded to {DISTINCT_DIGITS} digits): "
                + _listed(repeats, len(repeats))
            )

    return [batch_size, finite, dimensions, within_bounds, distinct]
