"""A Prefect server on PostgreSQL (asyncpg) runs the approval path: suspend, resume, complete."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from prefect import flow, get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.flow_runs import asuspend_flow_run, resume_flow_run
from prefect.input import RunInput

from flows._prefect._runner import deploy_flow, drive_once, make_runner
from flows._prefect._server import ServerHandle

pytestmark = [
    pytest.mark.integration,
    # The session's server start (12 s idle, over 60 s on a loaded 2-core box) is
    # bounded by start_server's own timeout; the 120 s budget is for the test.
    pytest.mark.timeout(120, func_only=True),
]


class Go(RunInput):
    """A one-field form; the schema must survive the PostgreSQL round trip."""

    approver: str


def _write_json(path: str, data: dict[str, str]) -> None:
    Path(path).write_text(json.dumps(data), encoding="utf-8")


@flow(name="postgres-toy")
async def postgres_toy(progress: str) -> None:
    """Suspend for a ``Go`` form, then write who approved."""
    go = await asuspend_flow_run(wait_for_input=Go, key="pg", timeout=600)
    _write_json(progress, go.model_dump())


class TestPostgresServer:
    def test_status_names_the_asyncpg_database(self, prefect_postgres_api: ServerHandle) -> None:
        assert prefect_postgres_api.database.startswith("postgresql+asyncpg://postgres@")

    def test_prefect_tables_live_in_the_fresh_database(
        self, prefect_postgres_api: ServerHandle
    ) -> None:
        database = prefect_postgres_api.database.rsplit("/", 1)[1]
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}") as conn:
            row = conn.execute("SELECT to_regclass('public.flow_run')").fetchone()
        assert row is not None
        assert row[0] == "flow_run"

    def test_a_suspended_run_resumes_to_completed(
        self, prefect_postgres_api: ServerHandle, tmp_path: Path
    ) -> None:
        runner = make_runner()
        deployment_id = deploy_flow(
            runner, postgres_toy, name=f"pg-{uuid.uuid4().hex[:8]}", by_module=False
        )
        progress = tmp_path / "approved.json"
        run = run_deployment(deployment_id, parameters={"progress": str(progress)}, timeout=0)
        assert isinstance(run, FlowRun)
        drive_once(runner)
        resume_flow_run(run.id, run_input={"approver": "ana"})
        drive_once(runner)

        with get_client(sync_client=True) as client:
            assert client.read_flow_run(run.id).state_type == StateType.COMPLETED
        assert json.loads(progress.read_text(encoding="utf-8")) == {"approver": "ana"}
