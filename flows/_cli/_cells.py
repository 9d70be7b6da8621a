"""What one table cell of ``inspect`` shows: a short summary by default, everything when wide.

A recorded value can be a whole batch (a list of candidates), a dictionary of scores
or a check's stderr. By default a cell says what it holds in a few words (``8
candidates``, ``accepted 3, fallback 1``, ``[0.25, 0.5]``), so a table fits a
100-column terminal; ``--wide`` shows each value in full, ``--json`` everything as
recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from rich.text import Text

# The longest text a narrow cell shows before it is cut with an ellipsis.
NARROW_TEXT: Final = 40
_ELLIPSIS: Final = "…"


def cell(value: Any, *, wide: bool = False) -> Text:
    """Return ``value`` as a cell: in full when ``wide``, else summarised."""
    return Text(full(value) if wide else short(value))


def full(value: Any) -> str:
    """Return ``value`` in full: numbers to 6 significant digits, the rest as compact JSON."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), default=str)


def short(value: Any, limit: int = NARROW_TEXT) -> str:
    """Return a summary of ``value`` of at most about ``limit`` characters."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, Mapping):
        return _mapping(value, limit)
    if isinstance(value, list | tuple):
        return _sequence(list(value), limit)
    return clip(str(value), limit)


def clip(text: str, limit: int = NARROW_TEXT) -> str:
    """Return the first line of ``text``, cut to ``limit`` characters with an ellipsis."""
    lines = text.strip().splitlines() or [""]
    first = lines[0]
    cut = len(first) > limit or len(lines) > 1
    return first[: limit - 1].rstrip() + _ELLIPSIS if cut else first


def _mapping(value: Mapping[str, Any], limit: int) -> str:
    if not value:
        return "-"
    candidates = value.get("candidates")
    if isinstance(candidates, list):  # a proposal: its batch, not its rationale
        return _sequence(candidates, limit)
    if isinstance(value.get("value"), int | float):  # a simulation's output: its value
        return short(value["value"], limit)
    return clip(", ".join(f"{k} {short(v, limit)}" for k, v in value.items()), limit)


def _sequence(value: list[Any], limit: int) -> str:
    if not value:
        return "none"
    if all(isinstance(v, list | tuple) for v in value):
        return f"{len(value)} candidate{'s' if len(value) != 1 else ''}"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        shown = ", ".join(f"{v:.3g}" for v in value[:4])
        more = f", … {len(value)} values" if len(value) > 4 else ""
        return f"[{shown}{more}]"
    return clip(", ".join(short(v, limit) for v in value), limit)
