"""The approval form: a Prefect ``RunInput`` the UI renders, bounded per request.

The UI renders the form from the JSON schema the flow stores when it suspends,
with the request's description as markdown above. Measured UI behaviour shapes
the fields: a switch left untouched is *omitted* from the input, so the decision
is an explicit, required choice (a select, no default), and the batch-size override is bounded per
request so the server itself refuses an out-of-range value (the run then stays
suspended).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from prefect.input import RunInput
from pydantic import Field, create_model, field_validator


class Approval(RunInput):
    """An approver's answer to a request."""

    # Required, with no default: the UI renders a select the approver must set (not
    # an "(Optional)" field that approves by default); what each choice does is
    # spelled out in the description above the form.
    decision: Literal["approve", "reject"] = Field(
        description="approve: run the batch; reject: stop the campaign."
    )
    approver: str = Field(
        min_length=1, max_length=100, description="Your name, as listed among the approvers."
    )
    comment: str = Field(default="", max_length=2000, description="Why (kept in the provenance).")
    batch_size: int | None = Field(
        default=None, ge=1, description="Optional: run only the first N candidates."
    )
    code: str = Field(
        default="",
        max_length=8,
        description="Your one-time code (6 digits), when the rule requires proof.",
    )
    candidates: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        min_length=1,
        description="Optional: run only these candidates, by their # in the Proposed batch table.",
    )

    @field_validator("candidates")
    @classmethod
    def _distinct(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("candidates must be distinct")
        return value


def _candidates_field(size: int) -> tuple[Any, Any]:
    """Return the subset field: a multi-select of the proposed batch's ``#`` numbers.

    Measured in the UI: ``list[int] | None`` renders as "list | None" tabs showing
    'Property is type "None"', then an "Add item" editor with free number boxes. An
    array whose items are an ``enum`` renders as one select listing exactly the
    numbers of the batch table, so an approver picks, not types; with a default of
    ``[]`` (no null branch) there is no type picker. The server checks an answer
    against this schema: an index outside the batch or a repeated one is refused and
    the run stays suspended. Empty (untouched) runs the whole batch.
    """
    if size < 1:
        return (
            list[int],
            Field(
                default=[],
                max_length=0,
                description="Overrides are switched off for this campaign; leave empty.",
            ),
        )
    numbers = Literal.__getitem__(tuple(range(size)))  # Literal[0, 1, ..., size - 1]
    return (
        list[numbers],  # type: ignore[valid-type]
        Field(
            default=[],
            max_length=size,
            json_schema_extra={"uniqueItems": True},
            description=(
                "Leave empty to run the whole batch. To run only some candidates, pick "
                f"their # (0 to {size - 1}) in the Proposed batch table above; the others "
                "are struck in your name."
            ),
        ),
    )


def approval_form(
    *, batch_size: int, description: str, allow_override: bool, require_code: bool = False
) -> type[Approval]:
    """Return the form for one request, its override bounded by the proposed batch.

    With ``require_code`` the one-time code is a required field of 6 digits, so the
    server refuses an answer without one and the run stays suspended; whether the
    code is right is the flow's judgement.
    """
    fields: dict[str, Any] = {
        "batch_size": (
            (
                int | None,
                Field(
                    default=None,
                    ge=1,
                    le=max(batch_size, 1),
                    description=f"Optional: run only the first N of the {batch_size} candidates.",
                ),
            )
            if allow_override
            # No number at all: the server refuses any, so an override the rule does not
            # allow is never "accepted" and then quietly ignored.
            else (
                None,
                Field(
                    default=None,
                    description="Overrides are switched off for this campaign; leave empty.",
                ),
            )
        )
    }
    fields["candidates"] = _candidates_field(batch_size if allow_override else 0)
    if require_code:
        fields["code"] = (
            str,
            Field(
                pattern=r"^\s*[0-9]{6}\s*$",
                description="Your one-time code (6 digits) from your authenticator: "
                "this rule requires proof of who you are.",
            ),
        )
    form = create_model("Approval", __base__=Approval, **fields)
    form._description = description  # read by RunInput.save
    return form
