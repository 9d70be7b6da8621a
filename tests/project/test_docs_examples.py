"""The runnable examples in the docs run and print what the docs say they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_acceptance_example_prints_what_the_doc_shows(tmp_path):
    text = (DOCS / "acceptance.md").read_text()
    example = text.split("## A runnable example", 1)[1]
    code, expected = re.findall(r"```(?:python)?\n(.*?)```", example, re.S)[:2]
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected.strip()
