"""Counts in words: ``1 fallback``, ``2 fallbacks``; ``alice or bob``."""

from __future__ import annotations

from collections.abc import Sequence


def count(n: int, noun: str, plural: str | None = None) -> str:
    """Return ``n noun`` with the noun in the plural unless ``n`` is one."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def either(names: Sequence[str]) -> str:
    """Return ``alice``, ``alice or bob``, ``alice, bob or carol``."""
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} or {names[-1]}"
