"""The public surface changes only on purpose, and imports stay light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import acceptance
import flows
import policies
import tasks


class TestExports:
    def test_acceptance_all_is_pinned(self):
        assert acceptance.__all__ == [
            "Attempt",
            "Disposition",
            "NotAccepted",
            "Outcome",
            "Rejected",
            "Verdict",
            "accept",
        ]

    def test_flows_all_is_pinned(self):
        assert flows.__all__ == [
            "Approval",
            "ApprovalEventRecord",
            "ApprovalRequest",
            "ApprovalRow",
            "CampaignEngine",
            "CampaignResult",
            "CampaignService",
            "CampaignSpec",
            "Checkpoint",
            "Hooks",
            "LoadedSpec",
            "ProvenanceDatabaseError",
            "ProvenanceStore",
            "ServerConfig",
            "ServerHandle",
            "Submitted",
            "TaskResultRecord",
            "approval_form",
            "approve_run",
            "campaign_flow",
            "configure_telemetry",
            "expire_approvals",
            "judge",
            "load_campaign",
            "load_server_config",
            "run_campaign",
            "spec_from_dict",
            "start_server",
            "stop_server",
            "submit_campaign",
        ]

    @pytest.mark.parametrize("module", [acceptance, policies, tasks, flows])
    def test_all_is_resolvable(self, module):
        # Ordering is ruff's RUF022 (isort-style), checked by the linter.
        for name in module.__all__:
            assert hasattr(module, name), name


def loaded_modules_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


class TestImportWeight:
    def test_importing_acceptance_loads_no_prefect_numpy_or_sdk(self):
        loaded = loaded_modules_after("import acceptance")
        for heavy in ("prefect", "numpy", "opentelemetry.sdk"):
            assert heavy not in loaded, heavy

    def test_importing_policies_loads_no_prefect_or_numpy(self):
        loaded = loaded_modules_after("import policies")
        for heavy in ("prefect", "numpy", "opentelemetry.sdk"):
            assert heavy not in loaded, heavy

    def test_importing_flows_loads_no_prefect(self):
        loaded = loaded_modules_after("import flows")
        assert "prefect" not in loaded

    def test_the_campaign_engine_runs_without_prefect(self):
        loaded = loaded_modules_after("from flows import CampaignEngine")
        assert "prefect" not in loaded

    @pytest.mark.parametrize("package", ["acceptance", "policies", "tasks", "flows"])
    def test_each_package_imports_alone_in_a_clean_process(self, package):
        subprocess.run([sys.executable, "-c", f"import {package}"], check=True)
