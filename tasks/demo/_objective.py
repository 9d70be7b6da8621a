"""The demo campaign's objective: a shifted, bumpy valley on ``[0, 1]^d``, minimum 0.

Run it as an executable task::

    echo '{"x": [0.3, 0.6]}' | python -m tasks.demo.objective --fidelity high --cost 2

It reads one candidate as JSON from stdin (``{"x": [...]}`` or a bare list),
writes ``{"value": ..., "fidelity": ..., "dim": ...}`` to stdout and exits 0;
bad input gets a message on stderr and exit status 2.

The high-fidelity value is ``sum(10 z_i^2 + (1 - cos(6 pi z_i)) / 2)`` plus a
Rosenbrock-like coupling ``5 (z_{i+1} - z_i^2)^2``, with ``z = x - minimiser``:
zero at the minimiser, positive elsewhere, with ripples that trap a greedy
search. The low-fidelity value drops the ripples, damps the coupling, adds a
small bias and deterministic noise (seeded by the candidate), and costs a tenth
of ``--cost``: the cheap, approximate model a verifier can afford.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

FIDELITIES: Final[tuple[str, ...]] = ("high", "low")
MAX_DIM: Final[int] = 256
_MAX_INPUT_BYTES: Final[int] = 1 << 20
# The plastic number's fractional multiples spread the minimiser over the box.
_PLASTIC: Final[float] = 1.324717957244746


def minimiser(dim: int) -> list[float]:
    """Return the point in ``[0, 1]^dim`` where the objective is 0 (its minimum)."""
    if not 1 <= dim <= MAX_DIM:
        raise ValueError(f"dim must be between 1 and {MAX_DIM}")
    return [round(0.3 + 0.4 * ((i + 1) / _PLASTIC % 1.0), 6) for i in range(dim)]


def objective(x: Sequence[float], fidelity: str = "high") -> float:
    """Return the objective at ``x`` (in ``[0, 1]^d``) at the given fidelity.

    Raises:
        ValueError: ``fidelity`` is unknown, ``x`` is empty or too long, or a
            coordinate is not finite or lies outside ``[0, 1]`` (named by index).
    """
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity must be one of {', '.join(FIDELITIES)}")
    _validate(x)
    z = [float(v) - c for v, c in zip(x, minimiser(len(x)), strict=True)]
    coupling = sum(5.0 * (b - a * a) ** 2 for a, b in itertools.pairwise(z))
    if fidelity == "high":
        return sum(10.0 * v * v + 0.5 * (1.0 - math.cos(6.0 * math.pi * v)) for v in z) + coupling
    return sum(10.0 * v * v for v in z) + 0.8 * coupling + 0.05 + 0.02 * _noise(x)


def _validate(x: Sequence[float]) -> None:
    if not 1 <= len(x) <= MAX_DIM:
        raise ValueError(f"a candidate has between 1 and {MAX_DIM} coordinates, got {len(x)}")
    for index, value in enumerate(x):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"coordinate {index} is not a number")
        if not math.isfinite(value):
            raise ValueError(f"coordinate {index} is not finite")
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"coordinate {index} = {value!r} lies outside [0, 1]")


def _noise(x: Sequence[float]) -> float:
    """Return a number in [-1, 1) fixed by the candidate, so low fidelity is repeatable."""
    digest = hashlib.sha256(json.dumps([float(v) for v in x]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**63 - 1.0


def _candidate(text: str) -> list[Any]:
    """Return the coordinates from ``{"x": [...]}`` or a bare list."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("stdin is not JSON") from None
    if isinstance(data, dict):
        if set(data) != {"x"}:
            raise ValueError('expected {"x": [...]} or a list of numbers')
        data = data["x"]
    if not isinstance(data, list):
        raise ValueError("the candidate must be a list of numbers")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate the candidate on stdin; return the exit status (2 for bad input)."""
    parser = argparse.ArgumentParser(
        prog="python -m tasks.demo.objective",
        description="Evaluate the demo objective at one candidate read as JSON from stdin.",
    )
    parser.add_argument("--fidelity", choices=FIDELITIES, default="high")
    parser.add_argument(
        "--cost",
        type=float,
        default=0.0,
        help="seconds a high-fidelity evaluation takes (low fidelity takes a tenth)",
    )
    args = parser.parse_args(argv)
    if not (math.isfinite(args.cost) and args.cost >= 0):
        print("objective: --cost must be a non-negative number of seconds", file=sys.stderr)
        return 2
    raw = sys.stdin.buffer.read(_MAX_INPUT_BYTES + 1)
    try:
        if len(raw) > _MAX_INPUT_BYTES:
            raise ValueError(f"stdin is larger than {_MAX_INPUT_BYTES} bytes")
        x = _candidate(raw.decode("utf-8", errors="replace"))
        value = objective(x, args.fidelity)
    except ValueError as exc:
        print(f"objective: {exc}", file=sys.stderr)
        return 2
    time.sleep(args.cost if args.fidelity == "high" else args.cost / 10.0)
    json.dump({"value": value, "fidelity": args.fidelity, "dim": len(x)}, sys.stdout)
    sys.stdout.write("\n")
    return 0
