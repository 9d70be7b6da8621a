"""The commands a user types while a campaign runs load only what they need.

``status``, ``approvals`` and ``approve`` talk to Prefect's REST API without
importing Prefect; ``inspect`` and ``export`` read the provenance without Prefect,
the round engine, SQLAlchemy or pydantic (stdlib ``sqlite3``, see
``flows/_provenance/_sqlite.py``); ``status <id>`` and ``approvals`` read a waiting
run's approval row the same way. Each command runs in a fresh interpreter under
``-X importtime`` against a real server and a real suspended campaign run, and
the modules it loaded are compared with what it may load. How fast they answer
is measured by ``benchmarks/commands.py``, not here.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"
# What the fast commands must never load: Prefect's SDK, the engine's numpy, the OTel SDK.
NEVER = ("prefect", "opentelemetry.sdk")
ENGINE = ("numpy",)
STORE = ("sqlalchemy", "sqlmodel", "alembic")
# What reading a SQLite provenance needs not: the store's validation and settings libraries.
VALIDATION = ("pydantic", "pydantic_core", "pydantic_settings")
_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|(\s*)(\S+)$")


@dataclass(frozen=True)
class Campaign:
    """A demo campaign whose run is suspended, waiting for an approval."""

    home: Path
    name: str
    flow_run_id: str


def loaded_modules(stderr: str) -> set[str]:
    """Return the modules ``-X importtime`` reported as imported."""
    return {m.group(2) for line in stderr.splitlines() if (m := _IMPORT_LINE.match(line))}


def run_command(args: list[str], home: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``unattended ARGS`` in a fresh interpreter; return it and the modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flows._cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "UNATTENDED_HOME": str(home), "PYTHONWARNINGS": ""},
    )
    return done, loaded_modules(done.stderr)


def heavy(modules: set[str], roots: tuple[str, ...]) -> list[str]:
    """Return which of ``roots`` (packages) were loaded."""
    return sorted(r for r in roots if any(m == r or m.startswith(r + ".") for m in modules))


@pytest.fixture(scope="module")
def suspended(prefect_server, tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    """Run the demo approval campaign until it suspends (on round 0, to be quick)."""
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService, read_run

    folder = tmp_path_factory.mktemp("fast-commands")
    for item in EXAMPLES.iterdir():
        shutil.copy(item, folder / item.name)
    spec = folder / "campaign-approval.toml"
    spec.write_text(spec.read_text().replace('name = "demo-approval"', 'name = "fast-commands"'))
    policy = folder / "approval-policy.toml"
    policy.write_text(policy.read_text().replace("round.index == 2", "round.index == 0"))
    home = folder / "home"

    async def until_suspended() -> str:
        submitted = await submit_campaign(spec, state_dir=home)
        await CampaignService(query_seconds=0.5, state_dir=home).run_once()
        run = await read_run(submitted.flow_run_id)
        assert run.state is not None
        assert run.state.type.value == "PAUSED"
        return str(submitted.flow_run_id)

    return Campaign(home, "fast-commands", asyncio.run(until_suspended()))


@pytest.fixture
def theirs(suspended) -> Iterator[list[str]]:
    """Another user's 201 waiting campaign runs, newer than ours, on the same server.

    Tagged as campaigns, of no deployment this state directory registered; Prefect's API
    returns at most 200 runs a request, so one page alone can never hold ours too.
    """
    from flows._prefect import _rest as rest

    env = os.environ
    flow = rest.request(env, "POST", "flows/", {"name": "someone-elses-campaign"})
    made: list[str] = []
    try:
        with rest.api(env) as client:
            for index in range(rest.PAGE + 1):
                body = {
                    "flow_id": flow["id"],
                    "name": f"theirs-{index}",
                    "tags": [rest.CAMPAIGN_TAG, "campaign:theirs"],
                    "state": {"type": "PAUSED", "name": "Suspended"},
                }
                made.append(str(client.checked("POST", "flow_runs/", body)["id"]))
        yield made
    finally:
        with rest.api(env) as client:
            for flow_run_id in made:
                client.call("DELETE", f"flow_runs/{flow_run_id}")


class TestManyRunsOnOneServer:
    """A shared server with more runs than one page of Prefect's API (issue 26)."""

    def test_status_and_approvals_still_list_ours(self, suspended, theirs):
        import json

        for command, key in (("status", "runs"), ("approvals", "approvals")):
            done, _ = run_command([command, "--json"], suspended.home)
            assert done.returncode == 0, done.stderr[-2000:]
            listed = [
                row.get("flow_run_id") or row.get("id") for row in json.loads(done.stdout)[key]
            ]
            assert listed == [suspended.flow_run_id], command

    def test_every_page_is_read_once(self, suspended, theirs, monkeypatch):
        from flows._prefect import _rest as rest

        monkeypatch.setattr(rest, "PAGE", 7)
        waiting = rest.filter_runs(os.environ, state_types=["PAUSED"], limit=None)
        ids = [str(run.id) for run in waiting]
        assert len(ids) == len(set(ids))
        assert set(theirs) | {suspended.flow_run_id} <= set(ids)


class TestPrefectCommands:
    def test_status_lists_runs_without_prefect_the_engine_or_the_store(self, suspended):
        done, modules = run_command(["status"], suspended.home)
        assert done.returncode == 0, done.stderr[-2000:]
        assert suspended.flow_run_id in done.stdout
        assert "fast-commands" in done.stdout
        assert heavy(modules, NEVER + ENGINE + STORE) == []

    def test_status_of_a_waiting_run_says_how_to_approve_without_prefect(self, suspended):
        done, modules = run_command(["status", suspended.flow_run_id], suspended.home)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Suspended" in done.stdout
        assert "approvers: alice" in done.stdout
        assert "answer by" in done.stdout
        # The run's spec is read for its own fields: neither the planners nor CEL load.
        assert heavy(modules, NEVER + ENGINE + STORE + ("cel",)) == []

    def test_approvals_lists_the_waiting_run_with_its_rule_without_prefect(self, suspended):
        done, modules = run_command(["approvals"], suspended.home)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"flow run {suspended.flow_run_id}" in done.stdout
        assert "rule: " in done.stdout
        # The run's spec is read for its own fields: neither the planners nor CEL load.
        assert heavy(modules, NEVER + ENGINE + STORE + ("cel",)) == []

    def test_an_unknown_run_is_bad_input_without_prefect(self, suspended):
        missing = "00000000-0000-4000-8000-000000000000"
        done, modules = run_command(["status", missing], suspended.home)
        assert done.returncode == 2
        assert f"no flow run {missing}" in done.stderr
        assert heavy(modules, NEVER + ENGINE + STORE) == []

    def test_approving_an_unknown_run_is_bad_input_and_sends_nothing(self, suspended):
        missing = "00000000-0000-4000-8000-000000000000"
        done, modules = run_command(["approve", missing, "--as", "alice"], suspended.home)
        assert done.returncode == 2
        assert f"no flow run {missing}" in done.stderr
        assert heavy(modules, NEVER + ENGINE + STORE) == []

    def test_approve_resumes_the_run_without_prefect_the_engine_or_the_store(self, suspended):
        from flows._prefect import _rest as rest

        # Without --no-wait, approve reads the flow's verdict from the store (issue 14).
        args = ["approve", suspended.flow_run_id, "--as", "alice", "--comment", "fast", "--no-wait"]
        done, modules = run_command(args, suspended.home)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "answer sent" in done.stdout
        assert heavy(modules, NEVER + ENGINE + STORE) == []
        from uuid import UUID

        assert not rest.read_run(os.environ, UUID(suspended.flow_run_id)).paused


@pytest.fixture
def running(prefect_server, tmp_path: Path) -> Iterator[tuple[Campaign, object]]:
    """A submitted campaign whose run is Running (forced through the API, no runner).

    Yields the campaign and its store, open for writing, so a test can take the lease
    for the run as a live flow run does; the run is deleted afterwards.
    """
    from flows._paths import campaign_dir
    from flows._prefect import _rest as rest
    from flows._prefect._deployment import submit_campaign
    from flows._provenance import ProvenanceStore

    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    spec = tmp_path / "campaign.toml"
    spec.write_text(spec.read_text().replace('name = "demo"', 'name = "fast-running"'))
    home = tmp_path / "home"
    submitted = asyncio.run(submit_campaign(spec, state_dir=home))
    run_id = str(submitted.flow_run_id)
    body = {"state": {"type": "RUNNING", "name": "Running"}, "force": True}
    rest.request(os.environ, "POST", f"flow_runs/{run_id}/set_state", body)
    store = ProvenanceStore.open(campaign_dir(home, "fast-running"))
    try:
        yield Campaign(home, "fast-running", run_id), store
    finally:
        store.close()
        rest.request(os.environ, "DELETE", f"flow_runs/{run_id}")


class TestRunningRuns:
    """A running campaign in ``status``: its recovery note, judged by the watchdog's rules."""

    def test_a_run_holding_its_live_lease_is_listed_without_prefect(self, running):
        campaign, store = running
        assert store.acquire_lease(campaign.name, campaign.flow_run_id, ttl=600).acquired
        done, modules = run_command(["status"], campaign.home)
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.splitlines()
        (at,) = [i for i, x in enumerate(lines) if campaign.flow_run_id in x]
        assert "Running" in lines[at]
        # No note under it: nothing recovers a run that holds its lease and is alive.
        assert not lines[at + 1 :] or not lines[at + 1].startswith("  "), done.stdout
        assert heavy(modules, NEVER + ENGINE + STORE) == []

    def test_without_the_lease_the_watchdog_s_rules_judge_it(self, running):
        campaign, store = running
        assert store.acquire_lease(campaign.name, campaign.flow_run_id, ttl=600).acquired
        store.release_lease(campaign.name)
        done, modules = run_command(["status"], campaign.home)
        assert done.returncode == 0, done.stderr[-2000:]
        assert campaign.flow_run_id in done.stdout
        assert "prefect" in heavy(modules, NEVER)  # the full judgement (recovery_note_of)


class TestProvenanceCommands:
    def test_inspect_reads_the_campaign_without_prefect_the_engine_or_the_store(self, suspended):
        done, modules = run_command(["inspect", suspended.name], suspended.home)
        assert done.returncode == 0, done.stderr[-2000:]
        assert suspended.name in done.stdout
        assert heavy(modules, NEVER + ENGINE + STORE + VALIDATION) == []

    def test_inspect_of_a_round_reads_it_without_the_store(self, suspended):
        done, modules = run_command(
            ["inspect", suspended.name, "--round", "0", "--json"], suspended.home
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert '"approvals"' in done.stdout
        assert heavy(modules, NEVER + ENGINE + STORE + VALIDATION) == []

    def test_export_writes_records_without_prefect_the_engine_or_the_store(self, suspended):
        done, modules = run_command(["export", suspended.name, "--format", "jsonl"], suspended.home)
        assert done.returncode == 0, done.stderr[-2000:]
        assert '"kind":"attempt"' in done.stdout
        assert '"kind":"approval"' in done.stdout
        assert heavy(modules, NEVER + ENGINE + STORE + VALIDATION) == []

    def test_an_unknown_campaign_is_bad_input_without_the_store(self, suspended):
        done, modules = run_command(["inspect", "no-such-campaign"], suspended.home)
        assert done.returncode == 2
        assert "no campaign named no-such-campaign in" in done.stderr
        assert heavy(modules, NEVER + ENGINE + STORE + VALIDATION) == []


class ScriptedApi:
    """A real HTTP server on 127.0.0.1 that answers POSTs with scripted statuses."""

    def __init__(self, statuses: list[int]) -> None:
        import http.server
        import threading

        self.statuses = list(statuses)
        self.seen: list[str | None] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                api.seen.append(self.headers.get("Authorization"))
                self.send_response(api.statuses.pop(0) if api.statuses else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"[]")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/api"


class TestRestClient:
    def test_the_auth_string_goes_to_the_api_as_http_basic_auth(self):
        from flows._prefect import _rest as rest

        with ScriptedApi([200]) as api:
            env = {"PREFECT_API_URL": api.url, "PREFECT_API_AUTH_STRING": "admin:s3cret"}
            assert rest.filter_runs(env) == []
        assert api.seen == ["Basic YWRtaW46czNjcmV0"]

    def test_a_busy_server_is_asked_again_as_prefect_s_client_does(self):
        from flows._prefect import _rest as rest

        with ScriptedApi([503, 503]) as api:
            assert rest.filter_runs({"PREFECT_API_URL": api.url}) == []
        assert len(api.seen) == 3
