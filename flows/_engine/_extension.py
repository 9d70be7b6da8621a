"""How a campaign's spec differs from the one recorded under its name, field by field.

A campaign is its name: the spec recorded at its first submission is what every
later submission is compared with. Two kinds of difference exist:

- an **extension**: only ``rounds`` and ``budget_node_hours`` differ, and each is
  larger. Submitting it (or ``unattended extend``) records a new revision of the
  campaign's inputs and a ``campaign_extended`` event; the next run does the
  rounds added, within the budget as raised.
- anything else (``seed``, ``batch_size``, ``objective.upper``, a lowered
  ``rounds``...) is another campaign: refused, naming each field that differs.

``check``, ``run``, ``submit`` and the flow itself ask these same questions, so
they say the same thing. Pure data: no store, no Prefect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from flows._provenance import SpecChanged
from policies import SpecInvalid

# The fields an extension may raise (and only raise).
EXTENSIBLE: Final[tuple[str, ...]] = ("rounds", "budget_node_hours")
_UNSET: Final = object()


@dataclass(frozen=True)
class FieldChange:
    """One dotted field whose recorded value differs from the spec's now."""

    field: str
    old: Any
    new: Any

    @property
    def grows(self) -> bool:
        """Return whether this is an extensible field raised (a number made larger)."""
        numbers = (int, float)
        return (
            self.field in EXTENSIBLE
            and isinstance(self.old, numbers)
            and isinstance(self.new, numbers)
            and not isinstance(self.old, bool)
            and not isinstance(self.new, bool)
            and self.new > self.old
        )

    def shown(self) -> str:
        """Return ``field (old -> new)``, values shown short (a table or list as its kind)."""
        return f"{self.field} ({_short(self.old)} -> {_short(self.new)})"


def spec_changes(
    recorded: Mapping[str, Any], recorded_seed: int | None, now: Mapping[str, Any], seed: int
) -> list[FieldChange]:
    """Return every dotted field that differs between the recorded spec and ``now``, sorted.

    ``recorded_seed`` is the seed column of the record (the spec may leave it out);
    a list differs as a whole (``objective.upper``), a table field by field.
    """
    found: dict[str, FieldChange] = {}
    _walk(recorded, now, "", found)
    if recorded_seed is not None and recorded_seed != seed:
        found["seed"] = FieldChange("seed", recorded_seed, seed)
    return [found[key] for key in sorted(found)]


def _walk(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key in sorted(set(old) | set(new)):
        field = f"{prefix}{key}"
        before, after = old.get(key, _UNSET), new.get(key, _UNSET)
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            _walk(before, after, f"{field}.", out)
        elif before != after:
            out[field] = FieldChange(field, before, after)


def is_extension(changes: Sequence[FieldChange]) -> bool:
    """Return whether ``changes`` only raise extensible fields (and are not empty)."""
    return bool(changes) and all(change.grows for change in changes)


def refused(name: str, changes: Sequence[FieldChange], file: str | None = None) -> SpecChanged:
    """Return the refusal of a spec that is not campaign ``name``'s, naming each field."""
    others = [c for c in changes if not c.grows]
    where = f"{file}: " if file else ""
    fields = ", ".join(c.shown() for c in others)
    verb = "differs" if len(others) == 1 else "differ"
    lowered = [c.field for c in others if c.field in EXTENSIBLE]
    why = f" ({' and '.join(lowered)} can only grow)" if lowered else ""
    return SpecChanged(
        f"{where}campaign {name!r} is recorded with another spec: {fields} {verb}{why}; "
        f"only {' and '.join(EXTENSIBLE)} may grow (an extension: 'unattended extend'); "
        "give a different campaign another name",
        details={
            "campaign": name,
            "input": "spec",
            "field": others[0].field if others else "spec",
            "fields": [c.field for c in others],
            **({"file": file} if file else {}),
        },
    )


def extension_details(changes: Sequence[FieldChange]) -> dict[str, dict[str, Any]]:
    """Return ``{field: {"old": ..., "new": ...}}``: what an extension event records."""
    return {c.field: {"old": c.old, "new": c.new} for c in changes}


def describe_extension(changes: Sequence[FieldChange]) -> str:
    """Return ``rounds 4 -> 6, budget_node_hours 64 -> 96``."""
    return ", ".join(f"{c.field} {_short(c.old)} -> {_short(c.new)}" for c in changes)


def _short(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list) and len(str(value)) > 40:
        return f"a list of {len(value)}"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def raised_text(text: str, values: Mapping[str, int | float]) -> str:
    """Return the spec's TOML ``text`` with top-level ``values`` rewritten in place.

    Only a top-level ``field = value`` line (before the first table) is rewritten,
    keeping its comment; the text must then read back as before but for those
    values, or :class:`SpecInvalid` names the field to edit by hand.
    """
    import re
    import tomllib

    before = tomllib.loads(text)
    head, rest = _split_at_first_table(text)
    for field, value in values.items():
        pattern = re.compile(
            rf"^(?P<key>{re.escape(field)}[ \t]*=[ \t]*)[^#\n]*?(?P<tail>[ \t]*(#.*)?)$", re.M
        )
        written = _toml_number(value)

        def keep_key_and_comment(m: re.Match[str], written: str = written) -> str:
            return f"{m['key']}{written}{m['tail']}"

        head, count = pattern.subn(keep_key_and_comment, head, count=1)
        if count != 1:
            raise SpecInvalid(
                f"field {field!r} is not written as one 'field = value' line at the top of "
                "the spec; edit it by hand and submit the spec",
                details={"field": field},
            )
    edited = head + rest
    after = tomllib.loads(edited)
    if after != {**before, **values}:
        raise SpecInvalid(
            "the spec did not read back as before but for "
            f"{', '.join(values)}; edit it by hand and submit the spec",
            details={"field": next(iter(values))},
        )
    return edited


def _split_at_first_table(text: str) -> tuple[str, str]:
    """Return the top-level part of the TOML text and the rest (its first table on)."""
    import re

    found = re.search(r"^[ \t]*\[", text, re.M)
    if found is None:
        return text, ""
    return text[: found.start()], text[found.start() :]


def _toml_number(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
