"""The example policy in docs/policies.md is a valid policy file."""

from __future__ import annotations

import re
from pathlib import Path

from policies import Severity, load_policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


class TestDocsExample:
    def test_example_file_loads(self, tmp_path: Path) -> None:
        found = re.search(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
        assert found is not None
        path = tmp_path / "policy.toml"
        path.write_text(found.group(1), encoding="utf-8")
        policy = load_policy(path)
        assert policy.name == "demo"
        assert policy.escalate_to is Severity.ASK
        assert len(policy.rules) == 4
