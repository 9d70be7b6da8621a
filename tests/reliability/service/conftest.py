"""Service reliability tests: make the shared helpers importable (importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "input"))  # model_endpoint
sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/: other_users, apt_get
