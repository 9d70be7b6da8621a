"""The crash suite's campaign: a counting model endpoint, a logging simulation, a direct runner.

Every campaign here is the same story (3 rounds, batch 4, attempts 2):

* round 0: answer 1 is out of bounds (rejected), answer 2 is accepted;
* round 1: answers 3 and 4 are rejected, the round runs its fallback;
* round 2: answer 5 is accepted but the policy sends it back (SOFT_BLOCK, a Retry),
  answer 6 in the second gate call is accepted. The rule also asks for the two
  decisions of rounds 0 and 1 in ``history.decisions``, so a restart that lost the
  campaign's earlier decisions takes another path and the record differs.

The model endpoint answers its Nth request with answer N and counts requests, so a
planner asked again for an answer the provenance holds shows as an extra request
and a shifted answer. The simulation appends one line per execution to a log, so
executions per round can be counted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # importlib mode: make crash_harness importable
pytest.register_assert_rewrite("crash_harness")  # its asserts show the values, as a test's do

from crash_harness import LoginNode  # noqa: E402 (needs the path above)

PROJECT = HERE.parents[2]
SIMULATION = HERE / "simulation.py"
ROUNDS = 3
BATCH = 4
RUN_TIMEOUT = 90.0

_GOOD = [[0.1, 0.2], [0.4, 0.4], [0.6, 0.3], [0.8, 0.9]]
ANSWERS: list[list[list[float]]] = [
    [[0.1, 0.1], [0.2, 1.5], [0.3, 0.3], [0.4, 0.4]],  # 1: out of bounds
    _GOOD,  # 2: accepted (round 0)
    [[0.5, 0.5], [0.5, 0.5], [0.6, 0.6], [0.7, 0.7]],  # 3: duplicates (distinct rejects)
    [[0.5, 0.5], [0.6, 0.6], [0.7, 0.7]],  # 4: three candidates (batch_size rejects)
    [[0.25, 0.3], [0.35, 0.3], [0.3, 0.25], [0.3, 0.35]],  # 5: accepted, policy retry
    [[0.2, 0.2], [0.4, 0.2], [0.2, 0.4], [0.4, 0.4]],  # 6: accepted (round 2, call 2)
]

POLICY = """\
[policy]
name = "crash-suite"
max_soft_attempts = 2

[[rules]]
name = "second-look"
description = "Round 2's first proposal is sent back once, seeing the two decisions before it."
advice = "Propose again."
severity = "SOFT_BLOCK"
when = "round.index == 2 && round.attempt == 1 && size(history.decisions) == 2"
"""

ASK_POLICY = (
    POLICY
    + """
[[rules]]
name = "review-round-1"
description = "Round 1 needs a human."
advice = "Approve or reject."
severity = "ASK"
when = "round.index == 1"
approvers = ["alice"]
"""
)

APPROVALS = """
[approvals]
approvers = ["alice"]
timeout_minutes = 60
on_timeout = "stop"
"""

SITE = """\
name = "crash-suite"
max_concurrency = 1
task_timeout = 60.0
retries = 0
retry_backoff = 0.0
transient_exit_codes = []
kill_grace = 1.0
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


class ModelServer:
    """A chat-completions endpoint that answers request N with answer N, and counts."""

    def __init__(self, answers: list[list[list[float]]]) -> None:
        self.answers = answers
        self.requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length)
                with server._lock:
                    server.requests += 1
                    number = server.requests
                if number <= len(server.answers):
                    content = json.dumps(
                        {"rationale": f"answer {number}", "candidates": server.answers[number - 1]}
                    )
                    body = {
                        "id": f"answer-{number}",
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": content},
                                "finish_reason": "stop",
                            }
                        ],
                    }
                    status = 200
                else:  # asked more often than the story has answers: a failure, visibly
                    body, status = {"error": "no more answers"}, 400
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Campaign:
    """One crash-suite campaign on disk: spec, site, policy, execution log and state."""

    name: str
    folder: Path
    server: ModelServer
    policy: str = POLICY
    approvals: str = ""
    spec: Path = field(init=False)
    site: Path = field(init=False)
    log: Path = field(init=False)
    home: Path = field(init=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.site = self.folder / "site.toml"
        self.site.write_text(SITE)
        (self.folder / "policy.toml").write_text(self.policy)
        self.log = self.folder / "executions.jsonl"
        self.home = self.folder / "home"
        simulation = [sys.executable, str(SIMULATION), str(self.log), "{round}", "{index}"]
        self.spec = self.folder / "campaign.toml"
        self.spec.write_text(
            f"""\
name = "{self.name}"
seed = 11
rounds = {ROUNDS}
batch_size = {BATCH}
attempts = 2
policy_retries = 1
budget_node_hours = 10.0
site = "{self.site}"
policy = "policy.toml"

[objective]
lower = [0.0, 0.0]
upper = [1.0, 1.0]
simulation = {json.dumps(simulation)}

[planner]
kind = "llm"
base_url = "{self.server.url}"
model = "numbered"
timeout = 30.0
{self.approvals}"""
        )

    @property
    def database(self) -> Path:
        return self.home / "campaigns" / self.name / "provenance.db"

    def run_direct(self, failpoints: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the campaign with ``python -m flows._cli._direct``, armed with ``failpoints``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
        if failpoints:
            env["UNATTENDED_FAILPOINTS"] = failpoints
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "flows._cli._direct",
                str(self.spec),
                "--state-dir",
                str(self.home),
            ],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )

    def crash_then_finish(self, *failpoints: str) -> dict[str, Any]:
        """Run once per failpoint (each must kill the process), then once to the end."""
        for point in failpoints:
            crashed = self.run_direct(point)
            assert crashed.returncode == -signal.SIGKILL, (point, crashed.stderr[-2000:])
        finished = self.run_direct()
        assert finished.returncode == 0, finished.stderr[-2000:]
        return dict(json.loads(finished.stdout.strip().splitlines()[-1]))

    def executions(self) -> Counter[int]:
        """Return how many simulations ran per round (from the execution log)."""
        if not self.log.exists():
            return Counter()
        lines = self.log.read_text().splitlines()
        return Counter(json.loads(line)["round"] for line in lines)

    def approval_events(self) -> list[tuple[Any, ...]]:
        """Return every recorded answer to an approval request: (key, decided_by, decision)."""
        connection = sqlite3.connect(f"file:{self.database}?mode=ro", uri=True)
        try:
            return [
                tuple(row)
                for row in connection.execute(
                    "SELECT a.key, e.decided_by, e.decision FROM approval_event e "
                    "JOIN approval a ON e.approval_id = a.id ORDER BY e.id"
                )
            ]
        finally:
            connection.close()

    def record(self) -> Record:
        """Read what the provenance holds, in a comparable form."""
        return Record.read(self.database)


@dataclass(frozen=True)
class Record:
    """The provenance of a campaign, as plain comparable data."""

    status: str
    attempts: list[tuple[Any, ...]]
    decisions: list[tuple[Any, ...]]
    gate_calls: list[tuple[Any, ...]]
    batches: list[tuple[Any, ...]]
    task_results: list[tuple[Any, ...]]
    rounds: list[tuple[Any, ...]]

    @classmethod
    def read(cls, database: Path) -> Record:
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:

            def rows(sql: str) -> list[tuple[Any, ...]]:
                return [tuple(row) for row in connection.execute(sql).fetchall()]

            status = rows("SELECT status FROM campaign")[0][0]
            attempts = rows(
                "SELECT g.round_index, g.call_index, a.number, a.rejected_by, a.reason, a.value "
                "FROM attempt a JOIN gate_call g ON a.gate_call_id = g.id "
                "ORDER BY g.round_index, g.call_index, a.number"
            )
            decisions = rows(
                "SELECT round_index, seq, outcome FROM policy_decision ORDER BY round_index, seq"
            )
            gate_calls = rows(
                "SELECT round_index, call_index, disposition, attempts_used, fallback_hash "
                "FROM gate_call ORDER BY round_index, call_index"
            )
            batches = rows("SELECT round_index, candidates, status FROM batch ORDER BY round_index")
            task_results = rows(
                "SELECT b.round_index, t.task_index, t.status, t.objective "
                "FROM task_result t JOIN batch b ON t.batch_id = b.id "
                "ORDER BY b.round_index, t.task_index"
            )
            rounds = rows(
                "SELECT round_index, status, surrogate_state, policy_state "
                "FROM round ORDER BY round_index"
            )
        finally:
            connection.close()
        return cls(status, attempts, decisions, gate_calls, batches, task_results, rounds)


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A counting model endpoint for one campaign."""
    server = ModelServer(ANSWERS)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def campaign(tmp_path: Path, model_server: ModelServer) -> Campaign:
    """A fresh crash-suite campaign."""
    return Campaign("crash-suite", tmp_path / "campaign", model_server)


@dataclass
class DemoCampaign:
    """A copy of ``examples/demo`` under its own name: the scripted planner and the verifier."""

    name: str
    folder: Path
    spec: Path = field(init=False)
    home: Path = field(init=False)

    def __post_init__(self) -> None:
        shutil.copytree(PROJECT / "examples" / "demo", self.folder)
        self.spec = self.folder / "campaign.toml"
        text = self.spec.read_text().replace('name = "demo"', f'name = "{self.name}"', 1)
        self.spec.write_text(text)
        self.home = self.folder / "home"

    @property
    def database(self) -> Path:
        return self.home / "campaigns" / self.name / "provenance.db"

    def record(self) -> Record:
        return Record.read(self.database)

    def verifier_runs(self) -> int:
        """Return how many verifier verdicts the provenance holds (one per judged attempt)."""
        connection = sqlite3.connect(f"file:{self.database}?mode=ro", uri=True)
        try:
            rows = connection.execute("SELECT verdicts FROM attempt").fetchall()
        finally:
            connection.close()
        return sum(
            1 for (text,) in rows for v in json.loads(text or "[]") if v["check"] == "verifier"
        )


@pytest.fixture
def demo_campaign(tmp_path: Path) -> Callable[[str], DemoCampaign]:
    """Build a copy of the demo campaign (it has a verifier) under ``name``."""

    def make(name: str) -> DemoCampaign:
        return DemoCampaign(name, tmp_path / name)

    return make


@pytest.fixture
def make_campaign(tmp_path: Path, model_server: ModelServer) -> Callable[..., Campaign]:
    """Build a campaign with its own name (a Prefect deployment per name) and options."""

    def make(name: str, **options: str) -> Campaign:
        return Campaign(name, tmp_path / name, model_server, **options)

    return make


@pytest.fixture
def login_nodes(
    prefect_server: Any, make_campaign: Callable[..., Campaign]
) -> Iterator[Callable[..., LoginNode]]:
    """Build a campaign and the login node that drives it; stop its runner at the end."""
    nodes: list[LoginNode] = []

    def make(name: str, **options: str) -> LoginNode:
        node = LoginNode(make_campaign(name, **options))
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        if node.runner_alive():
            node.stop()


@pytest.fixture
def ask_options() -> dict[str, str]:
    """Campaign options whose policy asks alice to approve round 1."""
    return {"policy": ASK_POLICY, "approvals": APPROVALS}


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Record, int, Counter[int]]:
    """Run the campaign once without a crash: its record, inference calls and executions."""
    server = ModelServer(ANSWERS)
    try:
        clean = Campaign("crash-suite", tmp_path_factory.mktemp("reference"), server)
        result = clean.crash_then_finish()
        assert result["status"] == "completed"
        return clean.record(), server.requests, clean.executions()
    finally:
        server.close()
