"""``unattended export --format ro-crate | prov``: a Provenance Run Crate and W3C PROV.

Real campaigns, run once per module by the engine itself (local site, real
executables, a real SQLite provenance database), with the code of the report tests'
``recorded_campaign`` (``tests/reports/conftest.py``): the demo campaign and the
approval demo (a fallback, an approval answered first by someone not allowed, a
policy retry). Their inputs are then pinned as a submission pins them, the site
config being a file that holds a canary secret. The crates are validated with
roc-validator against the Provenance Run Crate 0.5 profile, offline
(``crate_validator.py`` says how).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flows._cli import main

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent
SITE_SECRET = "sk-canary-site-5d1e9b07c3"
NOTIFY_SECRET = "sk-canary-notify-a48f2c61"
NOTIFY_URL = f"json://bot:{NOTIFY_SECRET}@127.0.0.1:9/hook"


def _reports_conftest() -> Any:
    """Load the report tests' campaign runner (their conftest) under a name of its own."""
    spec = importlib.util.spec_from_file_location(
        "reports_recorded_campaign", HERE.parent / "reports" / "conftest.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Campaign:
    """A recorded campaign: its name and its provenance database file."""

    name: str
    db: Path


def _pin_inputs(spec_path: Path, database: Path, site_path: Path) -> None:
    """Pin the campaign's inputs as ``submit`` does, with ``site_path`` as its site config."""
    from flows._engine._inputs import check_inputs
    from flows._provenance import ProvenanceStore
    from flows._spec import load_campaign
    from tasks._site import load_site

    store = ProvenanceStore.open(database)
    try:
        check_inputs(store, load_campaign(spec_path), load_site(site_path, env={}))
    finally:
        store.close()


def _run(folder: Path, spec_file: str, *, notify: bool = False) -> Campaign:
    reports = _reports_conftest()
    for item in reports.EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    spec_path = folder / spec_file
    if notify:  # a notify URL carries its service's token: the record keeps it masked
        spec_path.write_text(spec_path.read_text() + f'\n[notify]\nurls = ["{NOTIFY_URL}"]\n')
    site = folder / "canary-site.toml"
    site.write_text(
        (reports.EXAMPLES.parents[1] / "site-configs" / "local.toml").read_text()
        + f'\n[secrets]\nmodel_api_key = "{SITE_SECRET}"\n'
    )
    from flows._prefect._approval_form import Approval
    from flows._spec import load_campaign

    name = load_campaign(spec_path).spec.name
    database = folder / "state" / "campaigns" / name
    answers = iter(
        [
            Approval(decision="approve", approver="mallory", comment="not mine to give"),
            Approval(decision="approve", approver="alice", comment="round 2 reviewed"),
        ]
    )
    result = asyncio.run(reports.run_engine(spec_path, database, answers))
    assert result.status == "completed", result
    _pin_inputs(spec_path, database / "provenance.db", site)
    return Campaign(name, database / "provenance.db")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    """The demo campaign, run to completion, with a notify URL in its spec."""
    return _run(tmp_path_factory.mktemp("demo"), "campaign.toml", notify=True)


@pytest.fixture(scope="module")
def approval_demo(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    """The approval demo, run to completion (mallory refused, alice approved round 2)."""
    return _run(tmp_path_factory.mktemp("approval"), "campaign-approval.toml")


def _export(campaign: Campaign, fmt: str, out: Path) -> int:
    return main(
        ["export", campaign.name, "--format", fmt, "--out", str(out), "--db", str(campaign.db)]
    )


@pytest.fixture(scope="module")
def crates(
    demo: Campaign, approval_demo: Campaign, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Both campaigns exported through the CLI: the demo as a folder, the approval demo as a zip."""
    out = tmp_path_factory.mktemp("crates")
    assert _export(demo, "ro-crate", out / "demo") == 0
    assert _export(approval_demo, "ro-crate", out / "approval.zip") == 0
    unzipped = out / "approval"
    with zipfile.ZipFile(out / "approval.zip") as archive:
        archive.extractall(unzipped)
    return {"demo": out / "demo", "approval": unzipped, "zip": out / "approval.zip"}


def _graph(crate: Path) -> dict[str, dict[str, Any]]:
    metadata = json.loads((crate / "ro-crate-metadata.json").read_text())
    return {entity["@id"]: entity for entity in metadata["@graph"]}


def _types(entity: dict[str, Any]) -> set[str]:
    kinds = entity.get("@type", [])
    return {kinds} if isinstance(kinds, str) else set(kinds)


def _count(db: Path, sql: str) -> int:
    with sqlite3.connect(db) as connection:
        return int(connection.execute(sql).fetchone()[0])


def _db_counts(db: Path) -> dict[str, int]:
    return {
        "attempt": _count(db, "SELECT count(*) FROM attempt"),
        "decision": _count(db, "SELECT count(*) FROM policy_decision"),
        "approval": _count(db, "SELECT count(*) FROM approval"),
        "approval_event": _count(db, "SELECT count(*) FROM approval_event"),
        "simulation_task": _count(db, "SELECT count(*) FROM task_result"),
        "round": _count(db, "SELECT count(*) FROM round"),
        "gate_call": _count(db, "SELECT count(*) FROM gate_call"),
    }


class TestValidates:
    def test_both_crates_pass_the_provenance_run_crate_profile_offline(
        self, crates: dict[str, Path], tmp_path: Path
    ) -> None:
        """roc-validator, provenance-run-crate-0.5, REQUIRED level: no issue, no network."""
        if importlib.util.find_spec("rocrate_validator") is None:
            pytest.skip("RO-CRATE VALIDATION SKIPPED: pip install -e '.[validate]' (roc-validator)")
        crate_dirs = [str(crates["demo"]), str(crates["approval"])]
        done = subprocess.run(
            [
                sys.executable,
                str(HERE / "crate_validator.py"),
                str(tmp_path / "cache"),
                *crate_dirs,
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        found = json.loads(done.stdout.splitlines()[-1])
        assert found == {crate: {"passed": True, "issues": []} for crate in crate_dirs}

    def test_rocrate_reads_the_crate_back(self, crates: dict[str, Path]) -> None:
        from rocrate.rocrate import ROCrate

        crate = ROCrate(crates["approval"])
        assert crate.mainEntity.id == "spec.json"
        assert {p.id for p in crate.root_dataset["conformsTo"]} >= {
            "https://w3id.org/ro/wfrun/provenance/0.5",
            "https://w3id.org/ro/wfrun/workflow/0.5",
            "https://w3id.org/ro/wfrun/process/0.5",
        }
        assert crate.get("report/report.html") is not None
        assert crate.get("records.jsonl") is not None


class TestMapping:
    def test_every_recorded_action_is_in_the_crate(
        self, crates: dict[str, Path], approval_demo: Campaign
    ) -> None:
        graph = _graph(crates["approval"])
        steps = Counter(
            entity["instrument"]["@id"].removeprefix("#step/")
            for entity in graph.values()
            if "ControlAction" in _types(entity)
        )
        expected = _db_counts(approval_demo.db)
        assert {kind: steps[kind] for kind in expected} == expected

    def test_the_engine_run_lists_every_control_action(self, crates: dict[str, Path]) -> None:
        graph = _graph(crates["demo"])
        controls = {i for i, e in graph.items() if "ControlAction" in _types(e)}
        organize = graph["#engine-run"]
        assert {o["@id"] for o in organize["object"]} == controls
        assert organize["result"] == {"@id": "#run"}

    def test_approval_names_who_decided_who_was_refused_and_the_outcome(
        self, crates: dict[str, Path]
    ) -> None:
        graph = _graph(crates["approval"])
        approval = next(
            e for i, e in graph.items() if i.startswith("#approval/") and i.count("/") == 1
        )
        assert approval["agent"] == {"@id": "#person/alice"}
        assert graph[approval["result"]["@id"]]["value"] == "approved"
        answers = [e for i, e in graph.items() if "/event/" in i and "AssessAction" in _types(e)]
        by_agent = {a["agent"]["@id"]: a for a in answers}
        assert by_agent["#person/mallory"]["actionStatus"]["@id"].endswith("FailedActionStatus")
        assert graph[by_agent["#person/mallory"]["result"]["@id"]]["value"] == "not_allowed"
        assert graph["#person/alice"]["@type"] == "Person"

    def test_inputs_are_pinned_with_their_hashes(
        self, crates: dict[str, Path], demo: Campaign
    ) -> None:
        graph = _graph(crates["demo"])
        with sqlite3.connect(demo.db) as connection:
            pins = dict(connection.execute("SELECT name, sha256 FROM input_pin").fetchall())
        assert set(pins) >= {"spec", "policy", "transcript", "site", "simulation"}
        for name, digest in pins.items():
            assert graph[f"#input/{name}"]["value"] == f"sha256:{digest}"
        workflow = graph["spec.json"]
        assert {p["@id"] for p in workflow["input"]} == {f"#param/{n}" for n in pins}

    def test_tasks_say_where_they_ran_and_what_came_back(self, crates: dict[str, Path]) -> None:
        graph = _graph(crates["demo"])
        tasks = [
            e for i, e in graph.items() if i.startswith("#batch/") and "CreateAction" in _types(e)
        ]
        assert tasks
        assert all("location" in t and "result" in t and "object" in t for t in tasks)
        place = graph[tasks[0]["location"]["@id"]]
        assert place["@type"] == "Place"


class TestProv:
    def test_prov_json_parses_back_and_holds_every_record(
        self, approval_demo: Campaign, tmp_path: Path
    ) -> None:
        import prov

        assert _export(approval_demo, "prov", tmp_path / "approval") == 0
        assert (tmp_path / "approval.provn").read_text().startswith("document\n")
        assert (tmp_path / "approval.provn").read_text().rstrip().endswith("endDocument")
        document = prov.read(str(tmp_path / "approval.prov.json"), format="json")
        assert document is not None
        kinds = Counter(
            str(value).removeprefix("u:")
            for record in document.get_records()
            for key, value in record.attributes
            if str(key) == "prov:type" and str(value).startswith("u:")
        )
        expected = _db_counts(approval_demo.db)
        assert {kind: kinds[kind] for kind in expected} == expected
        agents = {
            str(r.identifier) for r in document.get_records() if r.get_type().localpart == "Agent"
        }
        assert {"run:person/alice", "run:person/mallory", "run:planner", "run:policy"} <= agents

    def test_the_crate_carries_the_same_prov(self, crates: dict[str, Path]) -> None:
        import prov

        document = prov.read(str(crates["approval"] / "provenance.prov.json"), format="json")
        assert document is not None
        assert list(document.get_records())


class TestSecrets:
    def test_no_secret_in_any_file_of_either_crate_or_the_zip(
        self, crates: dict[str, Path]
    ) -> None:
        leaked = [
            str(path)
            for crate in crates.values()
            for path in ([crate] if crate.is_file() else crate.rglob("*"))
            if path.is_file()
            and any(s.encode() in path.read_bytes() for s in (SITE_SECRET, NOTIFY_SECRET))
        ]
        assert leaked == []
        spec = json.loads((crates["demo"] / "spec.json").read_text())
        assert [url.startswith("<secret") for url in spec["notify"]["urls"]] == [True]

    def test_no_secret_and_no_model_text_in_the_ui_artifacts(
        self, demo: Campaign, approval_demo: Campaign
    ) -> None:
        """The round table, the summary and an approval's evidence, as the UI would show them."""
        from datetime import UTC, datetime

        from flows._engine._approval import ApprovalRequest
        from flows._prefect._artifact_views import (
            RoundTable,
            answered_markdown,
            evidence_markdown,
            summary_markdown,
        )
        from flows._provenance import ProvenanceStore

        rendered: list[str] = []
        model_text: set[str] = set()
        for campaign in (demo, approval_demo):
            with ProvenanceStore.open(campaign.db, read_only=True) as store:
                rendered.append(json.dumps(RoundTable(campaign.name).rows(store)))
                rendered.append(summary_markdown(store, campaign.name, "completed", None))
                view = store.round_view(campaign.name, 2)
                attempt = view["gate_calls"][0]["attempts"][0]
                rationale = (attempt["value"] or {}).get("rationale") or ""
                model_text |= {
                    str(a["value"]["rationale"])
                    for round_index in range(4)
                    for call in store.round_view(campaign.name, round_index)["gate_calls"]
                    for a in call["attempts"]
                    if isinstance(a["value"], dict) and a["value"].get("rationale")
                }
                request = ApprovalRequest(
                    campaign=campaign.name,
                    round_index=2,
                    call_index=1,
                    rule="review",
                    reason="a human looks at round 2",
                    advice="",
                    approvers=("alice",),
                    proposed=view["batches"][0]["candidates"],
                    fallback=view["gate_calls"][0]["fallback_value"],
                    node_hours=0.16,
                    budget_remaining=60.0,
                    disposition="accepted",
                    deadline=datetime.now(UTC),
                    require_proof=True,
                    rationale=f"{rationale} {SITE_SECRET}",
                )
                rendered.append(evidence_markdown(request, store, "run-id"))
                rendered.append(answered_markdown(request.key, 2, "approved", "alice"))
        assert model_text  # the demos' planner wrote rationales: they are what must not show
        leaks = [
            text
            for text in (SITE_SECRET, NOTIFY_SECRET, *model_text)
            if any(text in page for page in rendered)
        ]
        assert leaks == []

    def test_a_spec_recorded_before_masking_is_masked_in_the_crate(self, tmp_path: Path) -> None:
        """An older record kept the notify URL in its spec: the crate masks it again."""
        from flows._provenance import ProvenanceStore

        database = tmp_path / "old.db"
        raw = {
            "name": "old",
            "seed": 1,
            "notify": {"urls": [NOTIFY_URL], "webhook_url": NOTIFY_URL},
        }
        with ProvenanceStore.open(database) as store:
            store.ensure_campaign("old", spec=raw, site="local", seed=1, code_version="t")
            store.start_round("old", 0)
        assert NOTIFY_SECRET.encode() in database.read_bytes()  # the record holds it
        assert (
            main(
                [
                    "export",
                    "old",
                    "--format",
                    "ro-crate",
                    "--out",
                    str(tmp_path / "c"),
                    "--db",
                    str(database),
                ]
            )
            == 0
        )
        assert (
            main(
                [
                    "export",
                    "old",
                    "--format",
                    "prov",
                    "--out",
                    str(tmp_path / "p"),
                    "--db",
                    str(database),
                ]
            )
            == 0
        )
        files = [p for p in (tmp_path / "c").rglob("*") if p.is_file()]
        files += [tmp_path / "p.prov.json", tmp_path / "p.provn"]
        assert [str(p) for p in files if NOTIFY_SECRET.encode() in p.read_bytes()] == []


class TestCli:
    def test_unknown_campaign_writes_nothing(self, demo: Campaign, tmp_path: Path) -> None:
        code = main(
            [
                "export",
                "nope",
                "--format",
                "ro-crate",
                "--out",
                str(tmp_path / "c"),
                "--db",
                str(demo.db),
            ]
        )
        assert code == 2
        assert list(tmp_path.iterdir()) == []

    def test_records_does_not_apply(self, demo: Campaign, tmp_path: Path, capsys: Any) -> None:
        code = main(
            ["export", demo.name, "--format", "prov", "--records", "attempts", "--db", str(demo.db)]
        )
        assert code == 2
        assert "--records" in capsys.readouterr().err

    def test_refuses_a_folder_that_is_not_a_crate(
        self, demo: Campaign, tmp_path: Path, capsys: Any
    ) -> None:
        (tmp_path / "mine.txt").write_text("keep me")
        assert _export(demo, "ro-crate", tmp_path) == 2
        assert "--out" in capsys.readouterr().err
        assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]

    def test_replaces_an_earlier_crate(self, demo: Campaign, tmp_path: Path) -> None:
        assert _export(demo, "ro-crate", tmp_path / "c") == 0
        (tmp_path / "c" / "stale.txt").write_text("from before")
        assert _export(demo, "ro-crate", tmp_path / "c") == 0
        assert not (tmp_path / "c" / "stale.txt").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no temporary left
