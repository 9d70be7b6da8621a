"""Many campaigns at once on one Prefect server: all complete, nothing is lost.

8 campaigns share a Prefect server on PostgreSQL and one provenance database on
PostgreSQL (the site's ``provenance_url``); 4 share the default SQLite server,
each with its own SQLite provenance. Every campaign must complete with every
round, gate call, attempt, batch and task result recorded, and "database is
locked" must appear nowhere: not in the flow runs' logs or state messages, not
in the runner's output. The large version (``--long``) runs 16 campaigns of 4
rounds of 8.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_helpers import ROOT, demo_copy  # type: ignore[import-not-found]
from sqlalchemy import create_engine, text

from flows._prefect._rest import request
from flows._prefect._server import ServerHandle, client_env

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCKED = ("database is locked", "503 service unavailable")


def site_with(folder: Path, provenance_url: str | None) -> Path:
    """Write the local site, with ``provenance_url`` when given."""
    text_ = (
        (ROOT / "site-configs" / "local.toml")
        .read_text()
        .replace('name = "local"', 'name = "conc"')
    )
    if provenance_url:
        text_ = text_.replace(
            'listen = "127.0.0.1"', f'listen = "127.0.0.1"\nprovenance_url = "{provenance_url}"'
        )
    path = folder / "conc-site.toml"
    path.write_text(text_)
    return path


def specs(folder: Path, prefix: str, count: int, rounds: int, batch: int) -> list[Path]:
    return [
        demo_copy(
            folder / f"c{i}",
            "campaign.toml",
            f"{prefix}-{i}",
            seed=str(100 + i),
            rounds=str(rounds),
            batch_size=str(batch),
            planner__kind='"surrogate"',  # the transcript's batches have 8 candidates
            planner__transcript="",  # the surrogate takes no transcript
            objective__verifier_limit="",
        )
        for i in range(count)
    ]


async def run_all(paths: list[Path], site: Path, home: Path) -> list[Any]:
    """Submit every campaign at once, then drive one runner until all have exited."""
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService

    submitted = await asyncio.gather(
        *(submit_campaign(p, site=str(site), state_dir=home) for p in paths)
    )
    await CampaignService(query_seconds=0.5, state_dir=home).run_once()
    return list(submitted)


def check_recorded(url: str, names: list[str], rounds: int, batch: int) -> None:
    """Every campaign completed with every round, gate call, attempt and result recorded."""
    engine = create_engine(url)
    try:
        with engine.connect() as db:
            for name in names:
                where = {"name": name}
                cid = db.execute(text("SELECT id FROM campaign WHERE name = :name"), where).scalar()
                assert cid is not None, name
                status = db.execute(text("SELECT status FROM campaign WHERE id = :c"), {"c": cid})
                assert status.scalar() == "completed", name
                ids = {"c": cid}
                finished = db.execute(
                    text(
                        "SELECT COUNT(*) FROM round "
                        "WHERE campaign_id = :c AND finished_at IS NOT NULL"
                    ),
                    ids,
                ).scalar()
                assert finished == rounds, name
                calls = db.execute(
                    text(
                        "SELECT g.disposition, g.attempts_used, COUNT(a.id), "
                        "SUM(CASE WHEN a.verdicts IS NULL OR a.duration IS NULL THEN 1 ELSE 0 END) "
                        "FROM gate_call g LEFT JOIN attempt a ON a.gate_call_id = g.id "
                        "WHERE g.campaign_id = :c GROUP BY g.id, g.disposition, g.attempts_used"
                    ),
                    ids,
                ).all()
                assert len(calls) >= rounds, name
                for disposition, used, recorded, incomplete in calls:
                    assert disposition != "pending", name
                    assert used == recorded >= 1, name
                    assert incomplete == 0, name
                batches = db.execute(
                    text(
                        "SELECT b.round_index, b.status, COUNT(t.id) FROM batch b "
                        "LEFT JOIN task_result t ON t.batch_id = b.id WHERE b.campaign_id = :c "
                        "GROUP BY b.id, b.round_index, b.status ORDER BY b.round_index"
                    ),
                    ids,
                ).all()
                assert [(r, n) for r, _, n in batches] == [(r, batch) for r in range(rounds)], name
                assert all(s != "launched" for _, s, _ in batches), name
    finally:
        engine.dispose()


def check_no_lock_errors(server: ServerHandle, flow_run_ids: list[Any], output: str) -> None:
    ids = [str(i) for i in flow_run_ids]
    env = client_env(server)
    runs = request(env, "POST", "flow_runs/filter", {"flow_runs": {"id": {"any_": ids}}})
    assert {r["state"]["type"] for r in runs} == {"COMPLETED"}, [r["state"] for r in runs]
    logs = request(
        env, "POST", "logs/filter", {"logs": {"flow_run_id": {"any_": ids}}, "limit": 200}
    )
    assert logs  # the logs were read
    everything = (json.dumps(runs) + json.dumps(logs) + output).lower()
    for phrase in LOCKED:
        assert phrase not in everything


@pytest.fixture
def pg_provenance() -> Iterator[str]:
    """A fresh PostgreSQL database for the shared provenance; dropped after."""
    psycopg = pytest.importorskip("psycopg")
    name = f"unattended_test_conc_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _postgres_case(
    tmp_path: Path, server: ServerHandle, url: str, capfd: Any, count: int, rounds: int, batch: int
) -> None:
    prefix = f"pg{uuid.uuid4().hex[:6]}"
    paths = specs(tmp_path, prefix, count, rounds, batch)
    submitted = await run_all(paths, site_with(tmp_path, url), tmp_path / "home")
    output = capfd.readouterr()
    check_recorded(url, [f"{prefix}-{i}" for i in range(count)], rounds, batch)
    check_no_lock_errors(server, [s.flow_run_id for s in submitted], output.out + output.err)


class TestOnPostgres:
    @pytest.mark.timeout(300, func_only=True)
    async def test_eight_campaigns_share_the_server_and_the_provenance(
        self, prefect_postgres_api: ServerHandle, pg_provenance: str, tmp_path: Path, capfd: Any
    ) -> None:
        await _postgres_case(tmp_path, prefect_postgres_api, pg_provenance, capfd, 8, 2, 4)

    @pytest.mark.long
    @pytest.mark.timeout(1200, func_only=True)
    async def test_sixteen_larger_campaigns(
        self, prefect_postgres_api: ServerHandle, pg_provenance: str, tmp_path: Path, capfd: Any
    ) -> None:
        await _postgres_case(tmp_path, prefect_postgres_api, pg_provenance, capfd, 16, 4, 8)


class TestOnSQLite:
    @pytest.mark.timeout(300, func_only=True)
    async def test_four_campaigns_on_the_default_server(
        self, prefect_server: ServerHandle, tmp_path: Path, capfd: Any
    ) -> None:
        prefix = f"sq{uuid.uuid4().hex[:6]}"
        paths = specs(tmp_path, prefix, 4, 2, 4)
        home = tmp_path / "home"
        submitted = await run_all(paths, site_with(tmp_path, None), home)
        output = capfd.readouterr()
        for i in range(4):
            database = home / "campaigns" / f"{prefix}-{i}" / "provenance.db"
            check_recorded(f"sqlite:///{database}", [f"{prefix}-{i}"], 2, 4)
        check_no_lock_errors(
            prefect_server, [s.flow_run_id for s in submitted], output.out + output.err
        )
