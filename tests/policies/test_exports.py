"""The public surface of ``policies`` changes only on purpose, and importing it stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import policies

EXPECTED = [
    "CODES",
    "ApprovalError",
    "ApprovalRejected",
    "ApprovalTimeout",
    "ApproverNotAllowed",
    "BatchSummary",
    "Block",
    "BudgetExceeded",
    "CandidateView",
    "Continue",
    "DeadlineExceeded",
    "Decision",
    "Escalate",
    "FallbackUnavailable",
    "Firing",
    "InternalError",
    "NotAcceptedError",
    "NotFound",
    "Outcome",
    "Policy",
    "PolicyDenied",
    "ProviderError",
    "Retry",
    "RoundContext",
    "Rule",
    "RunStatus",
    "Severity",
    "SiteInvalid",
    "SoftBlockMode",
    "SpecInvalid",
    "Suspend",
    "TaskFailed",
    "UnattendedError",
    "ValidationFailed",
    "VerifierFailed",
    "classify",
    "combine",
    "load_policy",
    "policy_from_dict",
    "proposal_key",
    "run_status",
]


class TestPublicSurface:
    def test_all_is_pinned(self) -> None:
        assert policies.__all__ == EXPECTED

    def test_all_is_sorted(self) -> None:
        assert policies.__all__ == sorted(policies.__all__, key=lambda n: (not n.isupper(), n))

    def test_every_name_exists(self) -> None:
        missing = [name for name in policies.__all__ if not hasattr(policies, name)]
        assert missing == []


class TestImport:
    def test_import_pulls_no_heavy_dependency(self) -> None:
        code = (
            "import json, sys; import policies; "
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('prefect', 'numpy', 'sqlmodel', 'acceptance', 'tasks', 'flows')"
            " or m.startswith('opentelemetry.sdk'))))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert json.loads(done.stdout) == []
