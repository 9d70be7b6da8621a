"""Fixtures for the provenance tests: a fresh store on SQLite and on PostgreSQL.

PostgreSQL is the machine's server on 127.0.0.1:5432 (trust auth). One
database is migrated per session and used as the template of a fresh database
per test; every database created here is dropped at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def _admin() -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)


def _pg_available() -> bool:
    try:
        with _admin():
            return True
    except Exception:
        return False


def create_pg_database(template: str | None = None) -> str:
    """Create a uniquely named database (optionally from a template) and return its name."""
    name = f"unattended_test_prov_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        suffix = f" TEMPLATE {template}" if template else ""
        conn.execute(f"CREATE DATABASE {name}{suffix}")  # names are ours, not user input
    return name


def drop_pg_database(name: str) -> None:
    """Drop a database this module created, disconnecting leftover sessions."""
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """Return a migrated PostgreSQL database to copy per test (skip without a server)."""
    if not _pg_available():
        pytest.skip("no PostgreSQL server on 127.0.0.1:5432")
    from flows._provenance import ProvenanceStore

    name = create_pg_database()
    try:
        ProvenanceStore.open(PG_URL.format(name=name)).close()
        yield name
    finally:
        drop_pg_database(name)


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """Return the URL of a fresh, migrated PostgreSQL database for one test."""
    name = create_pg_database(template=pg_template)
    try:
        yield PG_URL.format(name=name)
    finally:
        drop_pg_database(name)


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Return where a fresh provenance database lives, on each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "campaign")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Any]:
    """Return an open store on a fresh database, closed after the test."""
    from flows._provenance import ProvenanceStore

    opened = ProvenanceStore.open(db_url)
    try:
        yield opened
    finally:
        opened.close()


def fill_campaign(store: Any, name: str = "demo", rounds: int = 2) -> None:
    """Record a small, complete campaign: gate calls, attempts, decisions, approval, batch."""
    from acceptance import Attempt, Verdict

    store.ensure_campaign(name, spec={"rounds": rounds}, site="local", seed=7, code_version="t")
    for index in range(rounds):
        store.start_round(name, index)
        call = store.record_gate_call(
            name,
            index,
            0,
            gate="planner",
            budget=3,
            fallback_hash=f"h{index}",
            fallback_value=[[0.5, 0.5]],
        )
        store.record_attempt(
            call,
            Attempt(
                number=1,
                value={"x": [9.0]},
                rejected_by="bounds",
                reason="x[0] above 1.0",
                verdicts=(
                    Verdict("schema", True, None, 0.001),
                    Verdict("bounds", False, "x[0] above 1.0", 0.002),
                ),
                duration=0.01,
            ),
        )
        store.record_attempt(
            call,
            Attempt(
                number=2,
                value={"x": [0.25]},
                verdicts=(Verdict("schema", True, None, 0.001),),
                scores={"novelty": 0.5},
                duration=0.02,
                trace_id="ab" * 16,
                span_id="cd" * 8,
            ),
        )
        store.finish_gate_call(call, "accepted", 2)
        store.record_decision(
            name,
            index,
            0,
            {
                "outcome": "suspend" if index == 1 else "continue",
                "reason": "node hours",
                "code": None,
                "rules_fired": ["big_batch"] if index == 1 else [],
            },
        )
        if index == 1:
            key = f"{name}-r1-approval"
            store.record_approval_request(
                name,
                index,
                key=key,
                rule="big_batch",
                approvers=["alice"],
                description="64 node hours",
                flow_run_id="run-1",
            )
            store.record_approval_event(
                key, decided_by="mallory", decision="approved", allowed=False
            )
            store.record_approval_event(
                key, decided_by="alice", decision="approved", comment="go", allowed=True
            )
        batch = f"{name}-r{index}-batch"
        store.record_batch_launched(
            batch, campaign=name, round_index=index, candidates=[[0.25], [0.75]], backend="local"
        )
        store.record_batch_results(
            batch,
            [
                {
                    "index": 0,
                    "key": f"{batch}-0",
                    "status": "done",
                    "value": 1.5 - index,
                    "runtime": 0.1,
                    "host": "node1",
                    "exit_code": 0,
                    "stderr_tail": "",
                    "attempts": 1,
                    "error_code": None,
                    "retries": [],
                },
                {
                    "index": 1,
                    "key": f"{batch}-1",
                    "status": "failed",
                    "value": None,
                    "runtime": 0.2,
                    "host": "node2",
                    "exit_code": 3,
                    "stderr_tail": "boom",
                    "attempts": 2,
                    "error_code": "task_failed",
                    "retries": [{"attempt": 1}],
                },
            ],
        )
        store.checkpoint_round(
            name,
            index,
            surrogate_state={"n": index + 1},
            policy_state={"spent": index},
            planner_state=None,
            status="completed",
        )


@pytest.fixture
def record_campaign() -> Any:
    """Return :func:`fill_campaign`, for tests that need a populated database."""
    return fill_campaign


@pytest.fixture(scope="session")
def pg_admin() -> dict[str, Any]:
    """Return the helpers that create and drop uniquely named PostgreSQL databases."""
    return {"create": create_pg_database, "drop": drop_pg_database}


@pytest.fixture
def widest_inspect_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Return ``widest(*argv) -> int``: ``inspect ARGV``'s widest line, at 100 columns and piped.

    Run twice: with ``COLUMNS=100`` (a 100-column terminal) and without ``COLUMNS`` (piped);
    each must exit 0, and the wider of the two is returned.
    """
    from flows._cli import main

    def widest(*argv: str) -> int:
        width = 0
        for columns in ("100", None):
            if columns is None:
                monkeypatch.delenv("COLUMNS", raising=False)
            else:
                monkeypatch.setenv("COLUMNS", columns)
            assert main(["inspect", *argv]) == 0
            out = capsys.readouterr().out
            width = max(width, *(len(line) for line in out.splitlines()))
        return width

    return widest
