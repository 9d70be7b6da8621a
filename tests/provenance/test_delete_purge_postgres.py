"""``unattended delete NAME --purge --yes`` on a PostgreSQL provenance, through the CLI.

The store-level purge is tested on PostgreSQL (``test_purge.py``) and the command on
SQLite (``tests/flows/test_delete.py``); here the command itself, against the
session's Prefect server, removes one campaign's rows from a PostgreSQL database it
shares with another campaign, whose rows stay.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from flows._provenance import ProvenanceStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

PROJECT = Path(__file__).resolve().parents[2]
EXAMPLES = PROJECT / "examples" / "demo"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


@pytest.fixture
def pg_url(pg_template: str, pg_admin: dict[str, Any]) -> Iterator[str]:
    """Return a fresh PostgreSQL database of its own (skips without a server)."""
    name = pg_admin["create"]()
    try:
        # The server trusts local connections: the password is there to be kept secret.
        yield PG_URL.format(name=name).replace("postgres@", "postgres:s3cret-pw@")
    finally:
        pg_admin["drop"](name)


def campaign_rows(url: str) -> dict[str, int]:
    """Return, per campaign name, how many rounds it has recorded."""
    store = ProvenanceStore.open(url)
    try:
        with store.engine.connect() as c:
            found = c.execute(
                text(
                    "SELECT c.name, count(r.id) FROM campaign c "
                    "LEFT JOIN round r ON r.campaign_id = c.id GROUP BY c.name"
                )
            )
            return {str(name): int(n) for name, n in found}
    finally:
        store.close()


def test_delete_purge_removes_the_campaign_from_a_shared_postgresql_provenance(
    prefect_server: Any, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._service import CampaignService

    name = f"pgdel-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    shutil.copytree(EXAMPLES, folder)
    site = (PROJECT / "site-configs" / "local.toml").read_text()
    assert 'listen = "127.0.0.1"' in site
    site = site.replace(
        'listen = "127.0.0.1"', f'listen = "127.0.0.1"\nprovenance_url = "{pg_url}"'
    )
    (folder / "pg-site.toml").write_text(site)
    spec = folder / "campaign.toml"
    text_ = spec.read_text().replace('name = "demo"', f'name = "{name}"', 1)
    text_ = text_.replace("rounds = 4", "rounds = 1").replace(
        'site = "local"', 'site = "pg-site.toml"'
    )
    spec.write_text(text_)
    home = folder / "home"
    monkeypatch.setenv("UNATTENDED_HOME", str(home))  # the runner driven here reads it
    with ProvenanceStore.open(pg_url) as other:  # another campaign sharing the database
        other.ensure_campaign("neighbour", spec={}, site="local", seed=1, code_version="v")
        other.start_round("neighbour", 0)

    asyncio.run(submit_campaign(spec, state_dir=home))
    asyncio.run(CampaignService(query_seconds=0.5, state_dir=home).run_once())
    assert campaign_rows(pg_url) == {name: 1, "neighbour": 1}

    deleted = subprocess.run(
        [sys.executable, "-m", "flows._cli", "delete", name, "--purge", "--yes"],
        cwd=PROJECT,
        env={**os.environ, "UNATTENDED_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert deleted.returncode == 0, deleted.stderr
    assert "provenance purged:" in deleted.stdout
    assert "s3cret-pw" not in deleted.stdout + deleted.stderr  # the URL's password is a secret
    assert campaign_rows(pg_url) == {"neighbour": 1}
    assert not (home / "campaigns" / name / "registration.json").exists()
