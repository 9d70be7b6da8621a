"""Campaigns whose simulations fail on purpose, run in this process by the direct runner."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
FAULTY = HERE / "faulty_simulation.py"

SITE = """\
name = "faults"
max_concurrency = 4
task_timeout = {task_timeout}
retries = 0
retry_backoff = 0.0
transient_exit_codes = []
kill_grace = 0.5
listen = "127.0.0.1"

[backend]
kind = "local"
executor = "thread"

[scheduler]
system = "none"

[cost]
node_hours_per_simulation = 0.01
node_hours_per_verifier = 0.001
"""


@dataclass
class FaultCampaign:
    """A surrogate-planned campaign (2 rounds, batch 4) whose simulation follows a fault plan."""

    folder: Path
    name: str = "faults"

    def write(
        self,
        plan: dict[str, str],
        *,
        rounds: int = 2,
        policy: str | None = None,
        verifier_limit: float | None = None,
        task_timeout: float = 60.0,
    ) -> Path:
        """Write the spec, site, plan (and policy); return the spec's path."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "plan.json").write_text(json.dumps(plan))
        site = self.folder / "site.toml"
        site.write_text(SITE.format(task_timeout=task_timeout))
        argv = [sys.executable, str(FAULTY), str(self.folder / "plan.json"), "{round}", "{index}"]
        lines = [
            f'name = "{self.name}"',
            "seed = 5",
            f"rounds = {rounds}",
            "batch_size = 4",
            "attempts = 2",
            "budget_node_hours = 10.0",
            f'site = "{site}"',
        ]
        if policy is not None:
            (self.folder / "policy.toml").write_text(policy)
            lines.append('policy = "policy.toml"')
        lines += [
            "",
            "[objective]",
            "lower = [0.0, 0.0]",
            "upper = [1.0, 1.0]",
            f"simulation = {json.dumps(argv)}",
        ]
        if verifier_limit is not None:
            lines.append(f"verifier_limit = {verifier_limit}")
        lines += ["", "[planner]", 'kind = "surrogate"', ""]
        spec = self.folder / "campaign.toml"
        spec.write_text("\n".join(lines))
        return spec

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def database(self) -> Path:
        """The campaign's provenance database (SQLite) in its state directory."""
        return self.home / "campaigns" / self.name / "provenance.db"

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Query the campaign's provenance database (read-only)."""
        database = self.database
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            return [tuple(row) for row in connection.execute(sql).fetchall()]
        finally:
            connection.close()

    def task_results(self) -> dict[tuple[int, int], dict[str, Any]]:
        """Return every recorded task result by (round, index)."""
        found = self.rows(
            "SELECT b.round_index, t.task_index, t.status, t.error_code, t.exit_code, "
            "t.stderr_tail, t.attempts FROM task_result t JOIN batch b ON t.batch_id = b.id"
        )
        names = ("status", "error_code", "exit_code", "stderr_tail", "attempts")
        return {(r, i): dict(zip(names, rest, strict=True)) for r, i, *rest in found}

    def campaign_row(self) -> tuple[str, str | None]:
        """Return the campaign's (status, error_code)."""
        status, code = self.rows("SELECT status, error_code FROM campaign")[0]
        return status, code


@pytest.fixture
def fault_campaign(tmp_path: Path) -> Callable[..., FaultCampaign]:
    """Return a factory of fault campaigns in this test's folder."""

    def make(name: str = "faults") -> FaultCampaign:
        return FaultCampaign(tmp_path / name, name)

    return make
