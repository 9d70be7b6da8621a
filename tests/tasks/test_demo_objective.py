"""The demo objective, in process and as a real executable."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.demo import minimiser, objective

ROOT = Path(__file__).resolve().parents[2]


def run(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tasks.demo.objective", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


class TestObjective:
    @pytest.mark.parametrize("dim", [1, 2, 5])
    def test_minimum_is_zero_at_the_minimiser(self, dim: int) -> None:
        assert objective(minimiser(dim)) == 0.0

    @pytest.mark.parametrize("dim", [1, 2, 5])
    def test_minimiser_lies_inside_the_unit_box(self, dim: int) -> None:
        assert all(0.0 < c < 1.0 for c in minimiser(dim))

    def test_value_is_positive_away_from_the_minimiser(self) -> None:
        centre = minimiser(2)
        for dx, dy in [(0.01, 0), (0, -0.02), (0.3, 0.3), (-0.5, 0.1)]:
            assert objective([centre[0] + dx, centre[1] + dy]) > 0.0

    def test_low_fidelity_is_repeatable_and_differs(self) -> None:
        x = [0.2, 0.7]
        assert objective(x, "low") == objective(x, "low")
        assert objective(x, "low") != objective(x, "high")

    def test_low_fidelity_tracks_high_fidelity(self) -> None:
        near, far = minimiser(2), [0.05, 0.95]
        assert objective(near, "low") < objective(far, "low")

    @pytest.mark.parametrize(
        ("x", "message"),
        [
            ([], "between 1 and 256"),
            ([0.5, math.nan], "coordinate 1 is not finite"),
            ([1.5], r"coordinate 0 = 1\.5 lies outside \[0, 1\]"),
            ([True], "coordinate 0 is not a number"),
        ],
    )
    def test_bad_candidates_are_refused_by_index(self, x: list[float], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            objective(x)

    def test_unknown_fidelity_is_refused(self) -> None:
        with pytest.raises(ValueError, match="fidelity must be one of high, low"):
            objective([0.5], "medium")


class TestExecutable:
    def test_object_input_gives_a_json_result(self) -> None:
        result = run(json.dumps({"x": [0.2, 0.7]}))
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer == {"value": objective([0.2, 0.7]), "fidelity": "high", "dim": 2}

    def test_bare_list_and_low_fidelity(self) -> None:
        result = run("[0.2, 0.7]", "--fidelity", "low", "--cost", "0")
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer["value"] == objective([0.2, 0.7], "low")
        assert answer["fidelity"] == "low"

    @pytest.mark.parametrize(
        ("stdin", "message"),
        [
            ("not json", "stdin is not JSON"),
            ('{"y": [0.5]}', 'expected {"x": [...]}'),
            ('"0.5"', "must be a list of numbers"),
            ("[0.5, NaN]", "coordinate 1 is not finite"),
            ('[0.5, "a"]', "coordinate 1 is not a number"),
            ("[2]", "coordinate 0 = 2 lies outside"),
            ("[" * 100_000, "stdin is not JSON"),
        ],
    )
    def test_bad_input_exits_2_with_a_message(self, stdin: str, message: str) -> None:
        result = run(stdin)
        assert result.returncode == 2
        assert result.stdout == ""
        assert message in result.stderr

    def test_negative_cost_exits_2(self) -> None:
        result = run("[0.5]", "--cost", "-1")
        assert result.returncode == 2
        assert "--cost must be a non-negative number" in result.stderr


class TestStartup:
    def test_running_the_objective_imports_no_heavy_library(self) -> None:
        # One process per evaluation: importing numpy, pydantic or httpx on the
        # way (through an eager ``tasks/__init__``) would cost more than the
        # evaluation. New exports of ``tasks`` go in its ``lazy_loader.attach`` table.
        probe = (
            "import sys, runpy; sys.argv = ['objective']; "
            "import tasks.demo.objective; "
            "print(sorted({'numpy', 'pydantic', 'httpx', 'prefect'} & set(sys.modules)))"
        )
        result = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[]", "tasks/__init__ imports eagerly: " + result.stdout
