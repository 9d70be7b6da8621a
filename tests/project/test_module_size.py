"""No module of the project is over 500 lines without a reason written at its top.

The reason is a paragraph of the module's docstring that starts with the marker
``Over 500 lines:`` and goes on to say why, in at least a few words (``MARKER``,
``has_reason``)::

    \"\"\"Replay a changed policy against a finished campaign's recorded rounds.

    Over 500 lines: one class walks the record round by round; ...
    \"\"\"

Lines are counted as ``wc -l`` counts them. A module being split as this is written
is listed in ``BEING_SPLIT`` instead; an entry whose module is no longer over the
limit, or now gives its reason, fails the test until it is taken off the list.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("acceptance", "policies", "tasks", "flows")
LIMIT = 500
MARKER = "Over 500 lines:"
# The marker, then a reason of at least three words.
_REASON = re.compile(rf"^{re.escape(MARKER)}\s+\S+\s+\S+\s+\S+", re.MULTILINE)

# Modules split in parallel branches; each entry goes once its split is merged (the
# test says which).
BEING_SPLIT: frozenset[str] = frozenset()


def line_count(text: str) -> int:
    """Return the number of lines as ``wc -l`` counts them (newline characters)."""
    return text.count("\n")


def has_reason(source: str) -> bool:
    """Return whether the module's docstring has a paragraph ``Over 500 lines: <why>``."""
    docstring = ast.get_docstring(ast.parse(source), clean=True) or ""
    paragraphs = re.split(r"\n\s*\n", docstring)
    return any(_REASON.match(paragraph.strip()) for paragraph in paragraphs)


def _modules() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return found


MODULES = _modules()


def test_no_module_is_over_the_limit_without_a_reason_at_its_top() -> None:
    over = {
        name: line_count(text)
        for name, text in MODULES.items()
        if line_count(text) > LIMIT and not has_reason(text) and name not in BEING_SPLIT
    }
    assert over == {}, f"split these, or say why at the top ({MARKER!r} paragraph): {over}"


def test_every_module_listed_as_being_split_still_needs_the_list() -> None:
    done = sorted(
        name
        for name in BEING_SPLIT
        if name not in MODULES or line_count(MODULES[name]) <= LIMIT or has_reason(MODULES[name])
    )
    assert done == [], f"take these off BEING_SPLIT: {done}"


class TestTheMarker:
    """What counts as a reason: the checker itself can say no."""

    @pytest.mark.parametrize(
        "docstring",
        [
            '"""Do one thing.\n\nOver 500 lines: one state machine, read top to bottom."""',
            '"""Over 500 lines: the table of every field stays in one place."""',
        ],
    )
    def test_a_paragraph_starting_with_the_marker_and_a_reason_counts(self, docstring: str) -> None:
        assert has_reason(docstring + "\nx = 1\n")

    @pytest.mark.parametrize(
        "source",
        [
            '"""Do one thing."""\n',
            '"""Do one thing.\n\nOver 500 lines:"""\n',  # the marker without a reason
            '"""Do one thing; it is over 500 lines: too bad."""\n',  # not a paragraph's start
            '# Over 500 lines: a comment is not the module\'s docstring.\n"""Do it."""\n',
            'x = 1\n"""Over 500 lines: a string after code is no docstring."""\n',
        ],
    )
    def test_anything_else_does_not(self, source: str) -> None:
        assert not has_reason(source)

    def test_lines_are_counted_as_wc_counts_them(self) -> None:
        assert line_count("a\nb\n") == 2
        assert line_count("a\nb") == 1
