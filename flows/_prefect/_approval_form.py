"""The approval form: a Prefect ``RunInput`` the UI renders, bounded per request.

The UI renders the form from the JSON schema the flow stores when it suspends,
with the request's description as markdown above, and the server checks every
answer against that same schema. Measured UI behaviour shapes the fields:

- a switch left untouched is *omitted* from the input, so the decision is an
  explicit, required choice (a select, no default);
- a string ``enum`` renders as a select (a list of them as a multi-select with
  chips), so the approver is picked among the allowed names and candidates are
  picked by rows that show their coordinates and prediction, never typed;
- ``X | None`` renders as type tabs ('Property is type "None"'), so optional
  numbers are plain bounded integers that are simply not required;
- properties are laid out by their ``position``: the fields a person must fill
  come first, the optional ones after.

The schema is stricter than the model the flow reads an answer with: the server
refuses a name or a row the form does not offer, while the flow's model still
reads any answer planted past the server (the input API) so ``judge`` refuses and
records it rather than failing the run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Literal

from prefect.input import RunInput
from pydantic import ConfigDict, Field, create_model, field_validator

from flows._engine._approval import SYSTEM_TIMEOUT_APPROVER, ApprovalRequest
from flows._prefect._identity_resume import STAMP

# A one-time code: six digits (the field), or none from the runner only (the schema).
_CODE = r"^\s*[0-9]{6}\s*$"
_CODE_OR_NONE = r"^(\s*[0-9]{6}\s*)?$"


def _shape_schema(schema: dict[str, Any], form: type[Approval]) -> None:
    """Shape the stored schema for the UI and the server (see the module docstring)."""
    properties: dict[str, Any] = schema.get("properties", {})
    # Written by the server only (flows._prefect._identity_resume): never a field of the
    # form, yet admitted when the server stamps it (patternProperties: the UI renders none).
    stamp = properties.pop(STAMP, None)
    if stamp is not None:
        schema["patternProperties"] = {f"^{STAMP}$": {"type": "string", "maxLength": 120}}
    if not form._require_code:
        # A plain rule asks for no code: no field, and the server refuses one.
        properties.pop("code", None)
        if "code" in schema.get("required", []):
            schema["required"].remove("code")
    if form._require_code:
        # Required (the UI marks it so), six digits from everyone but the runner, whose
        # answer to an expired request carries none: judged a timeout, code or not.
        schema["if"] = {
            "properties": {"approver": {"const": SYSTEM_TIMEOUT_APPROVER}},
            "required": ["approver"],
        }
        schema["else"] = {"properties": {"code": {"pattern": _CODE}}}
    if form._approvers:
        # The runner's watchdog answers an expired request under its own name; it is
        # the last choice, and judged a timeout only after the deadline.
        properties["approver"]["enum"] = [*form._approvers, SYSTEM_TIMEOUT_APPROVER]
        properties["approver"].pop("minLength", None)
        properties["approver"].pop("maxLength", None)
    size = properties.get("batch_size")
    if size is not None and "anyOf" in size:
        # A plain bounded integer, not required: no "int | None" type tabs.
        number = next(branch for branch in size["anyOf"] if branch.get("type") == "integer")
        properties["batch_size"] = {
            **number,
            "title": size.get("title", "Batch Size"),
            "description": size.get("description", ""),
        }
    picked = properties.get("candidates")
    if picked is not None and form._labels:
        # One select of the rows (chips once picked); untouched, it is left out.
        properties["candidates"] = {
            "type": "array",
            "title": "Candidates",
            "description": picked.get("description", ""),
            "items": {"type": "string", "enum": list(form._labels)},
            "uniqueItems": True,
            "maxItems": len(form._labels),
        }
    for position, name in enumerate(_ORDER):
        if name in properties:
            properties[name]["position"] = position


# The fields a person must fill first (decision, name, code), then the optional ones.
_ORDER = ("decision", "approver", "code", "candidates", "batch_size", "comment")


class Approval(RunInput):
    """An approver's answer to a request."""

    model_config = ConfigDict(json_schema_extra=_shape_schema)

    # Per request (set by ``approval_form``): who may answer, the rows' labels, proof.
    _approvers: ClassVar[tuple[str, ...]] = ()
    _labels: ClassVar[tuple[str, ...]] = ()
    _require_code: ClassVar[bool] = False

    # Required, with no default: the UI renders a select the approver must set (not
    # an "(Optional)" field that approves by default); what each choice does is said
    # once, in the description above the form.
    decision: Literal["approve", "reject"]
    approver: str = Field(min_length=1, max_length=100)
    comment: str = Field(default="", max_length=2000, description="Why (kept in the provenance).")
    batch_size: int | None = Field(default=None, ge=1)
    code: str = Field(default="", max_length=8)
    candidates: list[int] | None = None  # empty or None: the whole batch
    # Who the server authenticated: "approver:NAME" or "owner" ("": a server without logins).
    authenticated_as: str = Field(default="", max_length=120)

    @field_validator("candidates", mode="before")
    @classmethod
    def _rows(cls, value: Any) -> Any:
        """Read a picked row's label back as its # (an index, as ``judge`` reads it)."""
        if not isinstance(value, list) or not cls._labels:
            return value
        index = {label: i for i, label in enumerate(cls._labels)}
        return [index.get(item, item) if isinstance(item, str) else item for item in value]

    @field_validator("candidates")
    @classmethod
    def _distinct(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("candidates must be distinct")
        return value


def _candidates_field(size: int) -> tuple[Any, Any]:
    """Return the subset field as the flow reads it: distinct row numbers of the batch.

    Bounded by the batch, so an index planted past the server is refused when the
    flow reads the answer. What the UI offers and the server accepts (one label per
    row) is set by ``_shape_schema``; labels read back as these numbers. Empty
    (untouched) runs the whole batch.
    """
    if size < 1:
        return (list[int], Field(default=[], max_length=0))
    numbers = Literal.__getitem__(tuple(range(size)))  # Literal[0, 1, ..., size - 1]
    return (
        list[numbers],  # type: ignore[valid-type]
        Field(
            default=[],
            max_length=size,
            json_schema_extra={"uniqueItems": True},
            description=(
                f"Leave empty to run all {size}; pick rows to run only those "
                "(the others are struck in your name)."
            ),
        ),
    )


def approval_form(
    *,
    batch_size: int,
    description: str,
    allow_override: bool,
    require_code: bool = False,
    approvers: Sequence[str] = (),
    labels: Sequence[str] = (),
) -> type[Approval]:
    """Return the form for one request, its overrides bounded by the proposed batch.

    Args:
        batch_size: How many rows the proposed batch has.
        description: The request's markdown, shown above the fields.
        allow_override: Whether approving may run only some rows.
        require_code: Whether the rule requires proof: then the one-time code is a
            required field of 6 digits (the server refuses an answer without one;
            whether it is right is the flow's judgement). Otherwise there is no
            code field at all.
        approvers: The allowed names, offered as a select (free text when empty).
        labels: One label per row (``candidate_labels``), offered as the rows to
            pick; plain numbers ``0`` to ``batch_size - 1`` when empty.
    """
    fields: dict[str, Any] = {
        "approver": (
            str,
            Field(min_length=1, max_length=100, description="Who answers (allowed for this rule)."),
        ),
        "batch_size": (
            (
                int | None,
                Field(
                    default=None,
                    ge=1,
                    le=max(batch_size, 1),
                    description=f"Or run only rows #0 to #N-1 (N at most {batch_size}).",
                ),
            )
            if allow_override
            # No number at all: the server refuses any, so an override the rule does not
            # allow is never "accepted" and then quietly ignored.
            else (None, Field(default=None, description="Overrides are off for this campaign."))
        ),
        "candidates": _candidates_field(batch_size if allow_override else 0),
    }
    if require_code:
        fields["code"] = (
            str,
            Field(
                pattern=_CODE_OR_NONE,  # six digits unless the runner answers (see above)
                description="Your current 6-digit one-time code: this rule requires proof.",
            ),
        )
    form = create_model("Approval", __base__=Approval, **fields)
    form._approvers = tuple(approvers)
    form._labels = tuple(labels) if allow_override else ()
    form._require_code = require_code
    form._description = description  # read by RunInput.save
    return form


# What the engine calls to wait for an answer (flows._engine._round.Suspender).
Suspender = Callable[[ApprovalRequest, int], Awaitable[Any]]
_log = logging.getLogger("unattended.campaign")


def forget_answers(suspend: Suspender) -> Suspender:
    """Return ``suspend`` that deletes each answer from the server once the flow has read it.

    The answer (one-time code included) is then readable by nobody: not through
    ``GET /api/flow_runs/{id}/input/...``, not by a later run. The flow judges and
    records it from memory; a process killed between the two finds no answer on its
    next try and reads it as unreadable (refused, recorded), so the run asks again.
    """

    async def suspend_and_forget(request: ApprovalRequest, refused: int) -> Any:
        answer = await suspend(request, refused)
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        if context is not None and context.flow_run is not None:
            key = f"suspended-{request.pause_key(refused)}-response"
            try:
                async with get_client() as client:
                    await client.delete_flow_run_input(context.flow_run.id, key)
            except Exception as exc:  # noqa: BLE001  # gone already, or the server away: said
                _log.warning("answer %s not deleted from the server (%s)", key, type(exc).__name__)
        return answer

    return suspend_and_forget
