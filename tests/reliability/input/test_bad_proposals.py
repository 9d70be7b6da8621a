"""Hostile proposals and a misbehaving model endpoint, through a whole campaign.

Each case runs a one-round campaign (the real engine, executor and SQLite
provenance, driven in-process by ``flows._engine._direct.run_direct``) whose LLM planner
talks to a scripted endpoint on 127.0.0.1, or whose scripted planner replays a
hostile transcript. What the model *said* wrong is a recorded rejection and the
round falls back; what the *endpoint* did wrong (garbage body, HTTP error, a
hang) fails the campaign with ``provider_error``. Either way every gate call
and attempt row is complete: nothing is half-written.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from model_endpoint import (  # type: ignore[import-not-found]
    HANG,
    ModelEndpoint,
    Reply,
    batch_answer,
    completion,
    grid,
)

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]
GOOD = grid(4, 2)
NESTED = "[" * 100_000 + "]" * 100_000


def content_case(content: str) -> Reply:
    return (200, completion(content))


def first_is(token: str) -> str:
    """Return an answer whose first coordinate is the literal JSON ``token``."""
    rest = "[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]"
    return '{"rationale": "r", "candidates": [[' + token + ", 0.5], " + rest + "]}"


# name -> (reply to every request, the check expected to reject every attempt)
REJECTED: dict[str, tuple[Reply, str]] = {
    "nan": (content_case(first_is("NaN")), "finite"),
    "infinity": (content_case(first_is("Infinity")), "finite"),
    "huge-number": (content_case(first_is("1e400")), "finite"),
    "duplicates": ((200, batch_answer([[0.1, 0.2]] * 4)), "distinct"),
    "out-of-bounds": ((200, batch_answer([[1.5, 0.2], *GOOD[1:]])), "within_bounds"),
    "wrong-dimension": ((200, batch_answer([[0.1, 0.2, 0.3], *GOOD[1:]])), "dimensions"),
    "too-few": ((200, batch_answer(GOOD[:3])), "batch_size"),
    "million-candidates": ((200, batch_answer([[0.5, 0.5]] * 1_000_000)), "schema"),
    "deeply-nested-content": (
        content_case('{"rationale": "r", "candidates": ' + NESTED + "}"),
        "schema",
    ),
    "oversized-rationale": ((200, batch_answer(GOOD, rationale="x" * 5_000_000)), "schema"),
    "strings-for-numbers": ((200, batch_answer([["a", "b"], *GOOD[1:]])), "schema"),
    "candidates-object": (
        content_case('{"rationale": "r", "candidates": {"0": [0.1, 0.2]}}'),
        "schema",
    ),
    "content-not-json": (content_case("Sure! Here are four points: (0.1, 0.2) ..."), "schema"),
    "empty-content": (content_case(""), "schema"),
    "refusal": ((200, completion(None, refusal="I can't help with that")), "refusal"),
    "truncated": ((200, completion('{"rationale": "long', finish_reason="length")), "truncation"),
}

# name -> reply to every request; each fails the campaign with provider_error
PROVIDER_FAILURES: dict[str, Reply] = {
    "body-garbage": (200, b"\x00\xffnot json"),
    "body-html": (200, b"<html><body>502 Bad Gateway</body></html>"),
    "body-not-completion": (200, {"error": "no choices here"}),
    "body-deeply-nested": (200, NESTED.encode()),
    "http-500": (500, {"error": "internal"}),
    "http-401": (401, {"error": "bad key"}),
    "hang": HANG,
}


def write_campaign(folder: Path, planner: str) -> Path:
    spec = folder / "campaign.toml"
    spec.write_text(
        f"""name = "hostile"
seed = 5
rounds = 1
batch_size = 4
attempts = 2
budget_node_hours = 100.0

[objective]
lower = [0.0, 0.0]
upper = [1.0, 1.0]
simulation = "demo"

[planner]
{planner}
"""
    )
    return spec


def run(spec: Path, home: Path) -> Any:
    from flows._engine._direct import run_direct

    site = str(ROOT / "site-configs" / "local.toml")
    # The engine reads the planner's key from the environment it is given, not the process's.
    env = {"HOME": str(home), KEY_VAR: os.environ[KEY_VAR]}
    return asyncio.run(run_direct(spec, site=site, state_dir=home, env=env))


def rows(home: Path, query: str) -> list[tuple[Any, ...]]:
    database = home / "campaigns" / "hostile" / "provenance.db"
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        return list(connection.execute(query))


def assert_nothing_half_written(home: Path, *, interrupted: bool = False) -> None:
    """Every attempt row is whole; a gate call is settled unless a failure interrupted it."""
    calls = rows(
        home,
        "SELECT g.disposition, g.attempts_used, COUNT(a.id) FROM gate_call g "
        "LEFT JOIN attempt a ON a.gate_call_id = g.id GROUP BY g.id",
    )
    for disposition, used, recorded in calls:
        # A failure leaves its gate call pending: the point a restarted run asks again from.
        assert disposition != "pending" or interrupted
        assert used == recorded
    incomplete = rows(
        home, "SELECT COUNT(*) FROM attempt WHERE verdicts IS NULL OR duration IS NULL"
    )
    assert incomplete == [(0,)]
    launched = rows(home, "SELECT COUNT(*) FROM batch WHERE status = 'launched'")
    assert launched == [(0,)]


CANARY = "sk-canary-proposals-91c2"
KEY_VAR = "UNATTENDED_TEST_PROPOSALS_KEY"


def llm_planner(url: str, timeout: float = 20) -> str:
    return (
        f'kind = "llm"\nbase_url = "{url}"\nmodel = "m"\ntimeout = {timeout}\n'
        f'api_key_env = "{KEY_VAR}"'
    )


def dump(home: Path) -> str:
    tables = [t for (t,) in rows(home, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    return json.dumps(
        {t: [list(map(str, r)) for r in rows(home, f'SELECT * FROM "{t}"')] for t in tables}
    )


@pytest.fixture(autouse=True)
def _model_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, CANARY)  # ``run`` hands it to the engine


class TestModelSaysSomethingWrong:
    @pytest.mark.parametrize("case", sorted(REJECTED))
    def test_every_attempt_is_a_recorded_rejection_and_the_round_falls_back(
        self, case: str, tmp_path: Path
    ) -> None:
        reply, check = REJECTED[case]
        with ModelEndpoint(lambda n, body: reply) as model:
            result = run(write_campaign(tmp_path, llm_planner(model.url)), tmp_path / "home")

        assert (result.status, result.error_code) == ("completed", None)
        home = tmp_path / "home"
        assert rows(home, "SELECT disposition FROM gate_call") == [("fallback",)]
        assert rows(home, "SELECT rejected_by FROM attempt ORDER BY number") == [(check,)] * 2
        reasons = rows(home, "SELECT reason FROM attempt")
        assert all(reason and len(reason) < 2000 for (reason,) in reasons)
        assert rows(home, "SELECT COUNT(*) FROM task_result") == [(4,)]
        assert_nothing_half_written(home)


class TestEndpointMisbehaves:
    @pytest.mark.parametrize("case", sorted(PROVIDER_FAILURES))
    def test_the_campaign_fails_with_provider_error_and_nothing_half_written(
        self, case: str, tmp_path: Path
    ) -> None:
        reply = PROVIDER_FAILURES[case]
        with ModelEndpoint(lambda n, body: reply) as model:
            spec = write_campaign(tmp_path, llm_planner(model.url, timeout=1.0))
            result = run(spec, tmp_path / "home")

        assert (result.status, result.error_code) == ("failed", "provider_error")
        home = tmp_path / "home"
        assert rows(home, "SELECT status, error_code FROM campaign") == [
            ("failed", "provider_error")
        ]
        assert rows(home, "SELECT COUNT(*) FROM batch") == [(0,)]
        assert_nothing_half_written(home, interrupted=True)
        assert all(r["headers"].get("Authorization") == f"Bearer {CANARY}" for r in model.requests)
        assert CANARY not in f"{result!r} {dump(home)}"


TRANSCRIPT_ANSWERS = {
    "nan": (json.dumps({"answer": first_is("NaN")}), "finite"),
    "duplicates": (
        json.dumps({"answer": {"rationale": "r", "candidates": [[0.2, 0.2]] * 4}}),
        "distinct",
    ),
    "nested": (
        json.dumps({"answer": '{"rationale": "r", "candidates": ' + NESTED + "}"}),
        "schema",
    ),
    "million-candidates": (
        json.dumps({"answer": {"rationale": "r", "candidates": [[0.5, 0.5]] * 1_000_000}}),
        "schema",
    ),
}


class TestHostileTranscript:
    @pytest.mark.parametrize("case", sorted(TRANSCRIPT_ANSWERS))
    def test_a_recorded_hostile_answer_is_rejected_like_a_live_one(
        self, case: str, tmp_path: Path
    ) -> None:
        line, check = TRANSCRIPT_ANSWERS[case]
        (tmp_path / "transcript.jsonl").write_text(line + "\n" + line + "\n")
        spec = write_campaign(tmp_path, 'kind = "scripted"\ntranscript = "transcript.jsonl"')

        result = run(spec, tmp_path / "home")

        assert result.status == "completed"
        home = tmp_path / "home"
        assert rows(home, "SELECT rejected_by FROM attempt ORDER BY number") == [(check,)] * 2
        assert_nothing_half_written(home)
