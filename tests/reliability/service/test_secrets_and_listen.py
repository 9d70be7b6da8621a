"""Secrets never leak and nothing listens beyond 127.0.0.1, on a real campaign.

A canary API key sits in the environment (the LLM planner's ``api_key_env``) and
in the site config's ``[secrets]``. The campaign runs under a real ``unattended
serve`` runner process on a Dask local cluster, against a scripted model
endpoint on 127.0.0.1 whose first answer is garbage. Afterwards every output is
searched for the canary: the provenance database (every table, and its raw
bytes), every file in the state directory (telemetry, the runner's log), the
flow run, its task runs, deployment and logs on the Prefect API, and
``unattended inspect --json`` / ``export``. While it runs, the listening sockets
of the server, the runner and everything they started are sampled.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from model_endpoint import ModelEndpoint, batch_answer, completion, grid  # type: ignore[import-not-found]
from service_helpers import EXAMPLES  # type: ignore[import-not-found]

from flows._cli import main
from flows._prefect._rest import request
from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

CANARY = "sk-canary-0b5e7c9d2f41a8"
KEY_VAR = "UNATTENDED_TEST_MODEL_KEY"
NAME = "sec-canary"
LOCAL = {"127.0.0.1", "::1"}


def script(n: int, body: dict[str, Any]) -> tuple[int, Any]:
    if n == 0:
        return 200, completion("I cannot produce JSON today")  # a rejection, with a reason
    return 200, batch_answer(grid(4, 2, shift=0.07 * n))


def write_campaign(folder: Path, model_url: str) -> tuple[Path, Path]:
    site = folder / "canary-site.toml"
    site.write_text(
        f"""name = "canary-site"
max_concurrency = 8
listen = "127.0.0.1"

[backend]
kind = "dask"
cluster = "local"
n_workers = 2

[cost]
node_hours_per_simulation = 0.01

[secrets]
model_api_key = "${{{KEY_VAR}}}"
"""
    )
    (folder / "policy.toml").write_text((EXAMPLES / "policy.toml").read_text())
    spec = folder / "campaign.toml"
    spec.write_text(
        f"""name = "{NAME}"
seed = 3
rounds = 2
batch_size = 4
attempts = 3
budget_node_hours = 100.0
site = "{site}"
policy = "policy.toml"

[objective]
lower = [0.0, 0.0]
upper = [1.0, 1.0]
simulation = "demo"
simulation_cost = 0.5

[planner]
kind = "llm"
base_url = "{model_url}"
model = "demo-model"
api_key_env = "{KEY_VAR}"
timeout = 20
"""
    )
    return spec, site


class ListenSampler(threading.Thread):
    """Record the listening addresses of some process trees until stopped."""

    def __init__(self, roots: list[int]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.seen: dict[tuple[str, int], str] = {}
        self.pids: set[int] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for root in self.roots:
                try:
                    tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for process in tree:
                    try:
                        for conn in process.net_connections(kind="inet"):
                            if conn.status == psutil.CONN_LISTEN:
                                self.seen[(conn.laddr.ip, conn.laddr.port)] = process.name()
                                self.pids.add(process.pid)
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
            self.done.wait(0.2)


def wait_terminal(env: dict[str, str], flow_run_id: Any, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = request(env, "GET", f"flow_runs/{flow_run_id}")
        if run["state"]["type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            return run
        time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} did not finish within {timeout} s")


def dump_sqlite(path: Path) -> str:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        tables = [
            r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        return json.dumps(
            {
                t: [list(map(str, row)) for row in connection.execute(f'SELECT * FROM "{t}"')]
                for t in tables
            }
        )


def api_outputs(env: dict[str, str], flow_run_id: str) -> str:
    run = request(env, "GET", f"flow_runs/{flow_run_id}")
    flt = {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    logs = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}
    parts = [
        run,
        request(env, "POST", "logs/filter", logs),
        request(env, "POST", "task_runs/filter", flt),
        request(env, "GET", f"deployments/{run['deployment_id']}"),
    ]
    return json.dumps(parts)


@pytest.fixture(scope="module")
def finished(
    prefect_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Run the canary campaign under a real runner process; return what to search."""
    import asyncio

    from flows._prefect._deployment import submit_campaign

    folder = tmp_path_factory.mktemp("canary")
    home = folder / "home"
    env = dict(os.environ)
    env.update(
        {
            KEY_VAR: CANARY,
            "UNATTENDED_HOME": str(home),
            "PREFECT_LOCAL_STORAGE_PATH": str(folder / "results"),
        }
    )
    with ModelEndpoint(script) as model:
        spec, site = write_campaign(folder, model.url)
        os.environ[KEY_VAR] = CANARY  # submit validates the site, which expands ${KEY_VAR}
        try:
            submitted = asyncio.run(submit_campaign(spec, site=str(site), state_dir=home))
        finally:
            del os.environ[KEY_VAR]
        log = folder / "runner.log"
        with log.open("wb") as out:
            runner = subprocess.Popen(
                [sys.executable, "-m", "flows._cli", "serve", "--query-seconds", "0.5"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        sampler = ListenSampler([prefect_server.pid, runner.pid])
        sampler.start()
        try:
            run = wait_terminal(client_env(prefect_server), submitted.flow_run_id)
        finally:
            sampler.done.set()
            sampler.join(10)
            os.killpg(runner.pid, signal.SIGTERM)
            try:
                runner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait(timeout=30)
        requests = list(model.requests)
    return {
        "run": run,
        "home": home,
        "log": log,
        "folder": folder,
        "requests": requests,
        "sampler": sampler,
        "api": client_env(prefect_server),
        "server_pid": prefect_server.pid,
        "server_key": prefect_server.prefect_home / "tls" / "server.key",
        "flow_run_id": str(submitted.flow_run_id),
    }


class TestCanary:
    def test_the_campaign_completed_and_really_sent_the_key(self, finished: dict[str, Any]) -> None:
        assert finished["run"]["state"]["type"] == "COMPLETED", finished["run"]["state"]
        auth = {r["headers"].get("Authorization") for r in finished["requests"]}
        assert auth == {f"Bearer {CANARY}"}
        assert len(finished["requests"]) >= 3  # the garbage answer was re-asked

    def test_not_in_the_provenance_database(self, finished: dict[str, Any]) -> None:
        database = finished["home"] / "campaigns" / NAME / "provenance.db"
        dumped = dump_sqlite(database)
        assert '"attempt"' in dumped
        assert CANARY not in dumped
        for file in database.parent.glob("provenance.db*"):
            assert CANARY.encode() not in file.read_bytes(), file

    def test_not_in_any_file_of_the_state_directory_nor_the_runner_log(
        self, finished: dict[str, Any]
    ) -> None:
        files = [p for p in finished["home"].rglob("*") if p.is_file()] + [finished["log"]]
        assert any(p.name == "telemetry.jsonl" for p in files)
        leaked = [str(p) for p in files if CANARY.encode() in p.read_bytes()]
        assert leaked == []

    def test_not_on_the_prefect_api(self, finished: dict[str, Any]) -> None:
        text = api_outputs(finished["api"], finished["flow_run_id"])
        assert "gate" in text  # the logs were read
        assert CANARY not in text

    def test_not_in_inspect_or_export(
        self, finished: dict[str, Any], capsys: pytest.CaptureFixture[str]
    ) -> None:
        database = str(finished["home"] / "campaigns" / NAME / "provenance.db")
        assert main(["inspect", NAME, "--json", "--db", database]) == 0
        assert main(["inspect", NAME, "--round", "0", "--json", "--db", database]) == 0
        assert main(["export", NAME, "--format", "jsonl", "--db", database]) == 0
        out = capsys.readouterr()
        assert NAME in out.out
        assert CANARY not in out.out + out.err

    def test_the_servers_tls_key_is_private_and_in_no_output(
        self, finished: dict[str, Any]
    ) -> None:
        """The key that makes the server the server: 0600, never copied into a log or state."""
        key_file: Path = finished["server_key"]
        assert key_file.stat().st_mode & 0o777 == 0o600
        key = "".join(key_file.read_text().splitlines()[1:-1])  # the PEM body, one line
        files = [p for p in finished["home"].rglob("*") if p.is_file()] + [finished["log"]]
        leaked = [str(p) for p in files if key.encode() in p.read_bytes().replace(b"\n", b"")]
        assert leaked == []
        assert key not in api_outputs(finished["api"], finished["flow_run_id"])

    def test_the_provenance_file_is_private(self, finished: dict[str, Any]) -> None:
        database = finished["home"] / "campaigns" / NAME / "provenance.db"
        assert database.stat().st_mode & 0o777 == 0o600


class TestListen:
    def test_server_runner_and_dask_listen_on_loopback_only(self, finished: dict[str, Any]) -> None:
        sampler: ListenSampler = finished["sampler"]
        # The server, the Dask scheduler and its two workers at least (about 10 sockets seen).
        assert len(sampler.pids) >= 3, sampler.seen
        assert len(sampler.seen) >= 4, sampler.seen
        assert any(
            port == int(finished["api"]["PREFECT_API_URL"].rsplit(":", 1)[1].split("/")[0])
            for _, port in sampler.seen
        )
        outside = {addr: name for addr, name in sampler.seen.items() if addr[0] not in LOCAL}
        assert outside == {}
