"""A corpus of malformed specs, site configs, policies and transcripts, through the CLI.

Every case goes through ``unattended submit`` (and a share through ``unattended
run``) against a real Prefect server. Each must exit 2 with one ``error:`` line
naming the broken file and the field, register nothing on the server (no
deployment, no flow run) and write nothing in the state directory.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from flows._cli import main
from flows._prefect._rest import request
from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "examples" / "demo"
CANARY = "sk-canary-input-5d1e"

Data = dict[str, Any]


@dataclass(frozen=True)
class Case:
    """One malformed submission: which file is broken, how, and what the error must name."""

    id: str
    broken: str  # "spec" | "site" | "policy" | "transcript"
    change: Callable[[Data], Any] | None = None  # edits the parsed file in place
    raw: bytes | None = None  # or: the file's whole (broken) content
    names: tuple[str, ...] = ()  # what the error line must contain besides the file


def put(path: str, value: Any) -> Callable[[Data], None]:
    """Return an edit that sets the dotted ``path`` to ``value``."""

    def edit(data: Data) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return edit


def drop(path: str) -> Callable[[Data], None]:
    """Return an edit that removes the dotted ``path``."""

    def edit(data: Data) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        del node[last]

    return edit


def rule(field: str, value: Any, index: int = 0) -> Callable[[Data], None]:
    """Return an edit of one ``[[rules]]`` entry."""

    def edit(data: Data) -> None:
        data["rules"][index][field] = value

    return edit


def drop_rule_field(field: str) -> Callable[[Data], None]:
    def edit(data: Data) -> None:
        del data["rules"][0][field]

    return edit


def duplicate_rule(data: Data) -> None:
    data["rules"].append(copy.deepcopy(data["rules"][0]))


NAN, INF = float("nan"), float("inf")

CASES: list[Case] = [
    # --- the campaign spec -----------------------------------------------------------
    Case("name-uppercase", "spec", put("name", "Bad Name"), names=("'name'",)),
    Case("name-missing", "spec", drop("name"), names=("'name'",)),
    Case("name-too-long", "spec", put("name", "a" * 80), names=("'name'",)),
    Case("rounds-zero", "spec", put("rounds", 0), names=("'rounds'",)),
    Case("rounds-text", "spec", put("rounds", "three"), names=("'rounds'",)),
    Case("rounds-fraction", "spec", put("rounds", 2.5), names=("'rounds'",)),
    Case("batch-negative", "spec", put("batch_size", -1), names=("'batch_size'",)),
    Case("batch-million", "spec", put("batch_size", 10**6), names=("'batch_size'",)),
    Case("attempts-zero", "spec", put("attempts", 0), names=("'attempts'",)),
    Case("attempts-huge", "spec", put("attempts", 51), names=("'attempts'",)),
    Case("budget-zero", "spec", put("budget_node_hours", 0.0), names=("'budget_node_hours'",)),
    Case("budget-nan", "spec", put("budget_node_hours", NAN), names=("'budget_node_hours'",)),
    Case("budget-inf", "spec", put("budget_node_hours", INF), names=("'budget_node_hours'",)),
    Case("seed-negative", "spec", put("seed", -1), names=("'seed'",)),
    Case("unknown-key", "spec", put("roudns", 3), names=("'roudns'",)),
    Case(
        "policy-retries-table", "spec", put("policy_retries", {"x": 1}), names=("'policy_retries'",)
    ),
    Case("objective-missing", "spec", drop("objective"), names=("'objective'",)),
    Case("bounds-mismatch", "spec", put("objective.lower", [0.0]), names=("'objective.upper'",)),
    Case("bound-nan", "spec", put("objective.lower", [0.0, NAN]), names=("'objective.lower'",)),
    Case("bound-inf", "spec", put("objective.upper", [1.0, INF]), names=("'objective.upper'",)),
    Case(
        "bounds-inverted", "spec", put("objective.lower", [2.0, 0.0]), names=("'objective.upper'",)
    ),
    Case("bounds-empty", "spec", put("objective.lower", []), names=("'objective.lower'",)),
    Case("bound-text", "spec", put("objective.upper", ["one", 1.0]), names=("'objective.upper",)),
    Case(
        "simulation-unknown",
        "spec",
        put("objective.simulation", "fortran"),
        names=("'objective.simulation",),
    ),
    Case(
        "simulation-cost-negative",
        "spec",
        put("objective.simulation_cost", -1.0),
        names=("'objective.simulation_cost'",),
    ),
    Case("planner-kind", "spec", put("planner.kind", "oracle"), names=("'planner.kind'",)),
    Case(
        "planner-no-transcript",
        "spec",
        drop("planner.transcript"),
        names=("'planner.transcript'",),
    ),
    Case(
        "llm-no-url",
        "spec",
        put("planner", {"kind": "llm", "model": "m"}),
        names=("'planner.base_url'",),
    ),
    Case(
        "llm-key-in-spec",
        "spec",
        put(
            "planner",
            {
                "kind": "llm",
                "base_url": "http://127.0.0.1:9/v1",
                "model": "m",
                "api_key_env": CANARY,
            },
        ),
        names=("'planner.api_key_env'",),
    ),
    Case(
        "llm-timeout-zero",
        "spec",
        put(
            "planner",
            {"kind": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m", "timeout": 0},
        ),
        names=("'planner.timeout'",),
    ),
    Case(
        "transcript-missing",
        "spec",
        put("planner.transcript", "nowhere.jsonl"),
        names=("'planner.transcript'",),
    ),
    Case(
        "on-timeout-unknown",
        "spec",
        put("approvals.on_timeout", "ignore"),
        names=("'approvals.on_timeout'",),
    ),
    Case(
        "timeout-negative",
        "spec",
        put("approvals.timeout_minutes", -5.0),
        names=("'approvals.timeout_minutes'",),
    ),
    Case(
        "approver-empty", "spec", put("approvals.approvers", [""]), names=("'approvals.approvers",)
    ),
    Case(
        "approvals-unknown",
        "spec",
        put("approvals.everyone", True),
        names=("'approvals.everyone'",),
    ),
    Case("policy-missing", "spec", put("policy", "nowhere.toml"), names=("'policy'",)),
    # Refused at submission since issue 16 (they used to fail mid-run, or switch a guard off).
    Case("batch-size-bool", "spec", put("batch_size", True), names=("'batch_size'",)),
    Case(
        "simulation-empty-argv",
        "spec",
        put("objective.simulation", []),
        names=("'objective.simulation'", "needs at least the program"),
    ),
    Case(
        "simulation-not-found",
        "spec",
        put("objective.simulation", ["/nonexistent/bin/sim"]),
        names=("'objective.simulation'", "/nonexistent/bin/sim: no such file"),
    ),
    Case(
        "simulation-a-directory",
        "spec",
        put("objective.simulation", ["/tmp"]),
        names=("'objective.simulation'", "is a directory"),
    ),
    Case(
        "verifier-limit-nan",
        "spec",
        put("objective.verifier_limit", NAN),
        names=("'objective.verifier_limit'", "finite"),
    ),
    Case(
        "transcript-a-device",
        "spec",
        put("planner.transcript", "/dev/zero"),
        names=("'planner.transcript'", "/dev/zero: is not a regular file"),
    ),
    Case(
        "policy-a-directory",
        "spec",
        put("policy", "."),
        names=("'policy'", "is a directory"),
    ),
    Case("spec-not-toml", "spec", raw=b"name = 'x'\nrounds = = 3\n", names=("not valid TOML",)),
    Case("spec-binary", "spec", raw=b"\xff\xfe\x00garbage\x80", names=("cannot read",)),
    Case("spec-empty", "spec", raw=b"", names=("field",)),
    # --- the site config -------------------------------------------------------------
    Case("site-backend-kind", "site", put("backend.kind", "kubernetes"), names=("backend",)),
    Case("site-concurrency-zero", "site", put("max_concurrency", 0), names=("max_concurrency",)),
    Case("site-listen-host", "site", put("listen", "example.org"), names=("listen",)),
    Case("site-cost-missing", "site", drop("cost"), names=("cost",)),
    Case(
        "site-cost-zero",
        "site",
        put("cost.node_hours_per_simulation", 0.0),
        names=("cost.node_hours_per_simulation",),
    ),
    Case("site-secret-name", "site", put("secrets", {"Model-Key": CANARY}), names=("secrets",)),
    Case(
        "site-secret-unset-env",
        "site",
        put("secrets", {"model_api_key": "${UNATTENDED_TEST_UNSET_KEY}"}),
        names=("secrets.model_api_key", "UNATTENDED_TEST_UNSET_KEY"),
    ),
    Case(
        "site-api-url",
        "site",
        put("prefect_api_url", "ftp://example.org"),
        names=("prefect_api_url",),
    ),
    Case("site-unknown-key", "site", put("workers", 4), names=("workers",)),
    Case(
        "site-walltime",
        "site",
        put("scheduler", {"system": "slurm", "walltime": "2 hours"}),
        names=("scheduler.walltime",),
    ),
    Case("site-timeout-negative", "site", put("task_timeout", -1.0), names=("task_timeout",)),
    Case("site-retries-huge", "site", put("retries", 1000), names=("retries",)),
    Case("site-not-toml", "site", raw=b"[backend\nkind = local\n", names=("TOML",)),
    # --- the policy file -------------------------------------------------------------
    Case("policy-severity", "policy", rule("severity", "MAYBE"), names=("severity",)),
    Case("policy-cel-syntax", "policy", rule("when", "round.index >= && true"), names=("when",)),
    Case("policy-cel-not-bool", "policy", rule("when", "round.index + 1"), names=("when",)),
    Case("policy-rule-no-name", "policy", drop_rule_field("name"), names=("name",)),
    Case("policy-duplicate-rule", "policy", duplicate_rule, names=("fallback-streak",)),
    Case(
        "policy-unknown-setting", "policy", put("policy.strictness", "high"), names=("strictness",)
    ),
    Case("policy-not-toml", "policy", raw=b"[[rules]\nname=", names=("TOML",)),
    Case(
        "policy-empty",
        "policy",
        raw=b"",
        names=("'policy'", "has no rules", "allow_no_rules = true"),
    ),
    # --- the transcript the spec names -----------------------------------------------
    Case(
        "transcript-not-json",
        "transcript",
        raw=b'{"answer": "x"}\nnot json at all\n',
        names=("'planner.transcript'", ":2:"),
    ),
    Case(
        "transcript-no-answer",
        "transcript",
        raw=b'{"note": "only a note"}\n',
        names=("'planner.transcript'", ":1:"),
    ),
    Case(
        "transcript-empty",
        "transcript",
        raw=b"",
        names=("'planner.transcript'", "the transcript has no answers"),
    ),
]


def _write(path: Path, data: Data) -> None:
    path.write_bytes(tomli_w.dumps(data).encode())


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A valid campaign (spec, policy, transcript, site) in ``tmp_path``; the state dir unset."""
    for name in ("campaign.toml", "policy.toml", "transcript.jsonl"):
        shutil.copy(DEMO / name, tmp_path / name)
    shutil.copy(ROOT / "site-configs" / "local.toml", tmp_path / "site.toml")
    monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("UNATTENDED_TEST_UNSET_KEY", raising=False)
    return tmp_path


def _break(workspace: Path, case: Case) -> Path:
    """Apply ``case`` to the workspace; return the broken file."""
    file = {
        "spec": "campaign.toml",
        "site": "site.toml",
        "policy": "policy.toml",
        "transcript": "transcript.jsonl",
    }[case.broken]
    path = workspace / file
    spec = tomllib.loads((workspace / "campaign.toml").read_text())
    spec["name"] = f"badin-{case.id}"[:60]
    _write(workspace / "campaign.toml", spec)
    if case.raw is not None:
        path.write_bytes(case.raw)
    else:
        data = tomllib.loads(path.read_text())
        assert case.change is not None
        case.change(data)
        _write(path, data)
    return path


def _count(server: ServerHandle, what: str) -> int:
    return int(request(client_env(server), "POST", f"{what}/count", {}))


class TestBadSubmission:
    def test_the_unbroken_workspace_validates(self, workspace: Path) -> None:
        """The corpus breaks one thing at a time in files that are otherwise valid."""
        from flows._prefect._submissions import validate_submission

        loaded, _ = validate_submission(
            workspace / "campaign.toml", str(workspace / "site.toml"), {}
        )
        assert loaded.spec.name == "demo"

    @pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
    def test_is_refused_naming_file_and_field_with_nothing_registered_or_written(
        self,
        case: Case,
        workspace: Path,
        prefect_server: ServerHandle,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        broken = _break(workspace, case)
        before = (_count(prefect_server, "deployments"), _count(prefect_server, "flow_runs"))
        command = "run" if CASES.index(case) % 4 == 0 else "submit"
        site = str(workspace / "site.toml")

        code = main([command, str(workspace / "campaign.toml"), "--site", site])

        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("error: "), err
        assert str(broken.resolve()) in err or str(broken) in err, err
        for fragment in case.names:
            assert fragment in err, err
        assert CANARY not in err
        after = (_count(prefect_server, "deployments"), _count(prefect_server, "flow_runs"))
        assert after == before
        assert not (workspace / "home").exists()


class TestConsoleScript:
    def test_the_installed_command_exits_2_naming_the_field(
        self, workspace: Path, prefect_server: ServerHandle
    ) -> None:
        """The real ``unattended`` entry point, in its own process, behaves like ``main``."""
        case = next(c for c in CASES if c.id == "bounds-inverted")
        _break(workspace, case)
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "unattended"),
                "submit",
                str(workspace / "campaign.toml"),
                "--site",
                str(workspace / "site.toml"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2
        assert "field 'objective.upper'" in result.stderr
        assert not (workspace / "home").exists()


class TestNamedForWhatItIs:
    def test_a_relative_site_path_that_is_missing_names_the_spec_field(
        self, workspace: Path, prefect_server: ServerHandle, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Without --site, the spec's ``site`` named the file: the error says so."""
        spec = tomllib.loads((workspace / "campaign.toml").read_text())
        spec["site"] = "missing-site.toml"
        _write(workspace / "campaign.toml", spec)

        code = main(["submit", str(workspace / "campaign.toml")])

        err = capsys.readouterr().err
        assert code == 2, err
        assert f"{workspace / 'campaign.toml'}: field 'site': " in err, err
        assert f"{workspace / 'missing-site.toml'}: no such file" in err, err
        assert not (workspace / "home").exists()

    def test_a_device_given_as_the_spec_is_not_a_regular_file(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["submit", "/dev/zero"]) == 2
        assert capsys.readouterr().err == "error: /dev/zero: is not a regular file\n"

    def test_a_directory_given_as_the_spec_is_a_directory(
        self, workspace: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["submit", str(workspace)]) == 2
        assert capsys.readouterr().err == f"error: {workspace}: is a directory, not a file\n"

    def test_a_directory_given_as_the_site_is_a_directory(
        self, workspace: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code = main(["submit", str(workspace / "campaign.toml"), "--site", str(workspace)])
        assert code == 2
        assert (
            capsys.readouterr().err == f"error: --site: {workspace}: is a directory, not a file\n"
        )
