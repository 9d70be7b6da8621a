"""The approval form: a Prefect ``RunInput`` the UI renders, bounded per request.

The UI renders the form from the JSON schema the flow stores when it suspends,
with the request's description as markdown above. Measured UI behaviour shapes
the fields: a switch left untouched is *omitted* from the input, so the decision
is an explicit choice with a default, and the batch-size override is bounded per
request so the server itself refuses an out-of-range value (the run then stays
suspended).
"""

from __future__ import annotations

from typing import Any, Literal

from prefect.input import RunInput
from pydantic import Field, create_model


class Approval(RunInput):
    """An approver's answer to a request."""

    decision: Literal["approve", "reject"] = Field(
        default="approve", description="Approve the batch as proposed, or reject it."
    )
    approver: str = Field(
        min_length=1, max_length=100, description="Your name, as listed among the approvers."
    )
    comment: str = Field(default="", max_length=2000, description="Why (kept in the provenance).")
    batch_size: int | None = Field(
        default=None, ge=1, description="Optional: run only the first N candidates."
    )


def approval_form(*, batch_size: int, description: str, allow_override: bool) -> type[Approval]:
    """Return the form for one request, its override bounded by the proposed batch."""
    upper = batch_size if allow_override else 0
    fields: dict[str, Any] = {
        "batch_size": (
            int | None,
            Field(
                default=None,
                ge=1,
                le=max(upper, 1),
                description=(
                    f"Optional: run only the first N of the {batch_size} candidates."
                    if allow_override
                    else "Overrides are switched off for this campaign; leave empty."
                ),
            ),
        )
    }
    form = create_model("Approval", __base__=Approval, **fields)
    form._description = description  # read by RunInput.save
    return form
